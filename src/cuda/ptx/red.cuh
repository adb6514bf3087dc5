// Fire-and-forget global reductions (red: an atomic add whose old value nobody waits for).
//
// The vector form adds four consecutive floats with one instruction and one L2 operation; it
// exists from sm_90 on, so code compiled for an older target falls back to four scalar adds.
// Only the arch-90 copy of a kernel compiled from compute_90 PTX takes the vector path.
#pragma once

namespace fusedattn::cuda::ptx {

// True in device code compiled for sm_90 or later, where red_add_f32x4 is a single instruction.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool kHasVectorRed = true;
#else
inline constexpr bool kHasVectorRed = false;
#endif

// red.global.add.v4.f32 [addr], {v.x, v.y, v.z, v.w};   (PTX ISA 8.1, sm_90+)
// addr must be 16-byte aligned. Relaxed, gpu scope, like atomicAdd.
__device__ __forceinline__ void red_add_f32x4(float* addr, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(addr + 0, v.x);
  atomicAdd(addr + 1, v.y);
  atomicAdd(addr + 2, v.z);
  atomicAdd(addr + 3, v.w);
#endif
}

}  // namespace fusedattn::cuda::ptx
