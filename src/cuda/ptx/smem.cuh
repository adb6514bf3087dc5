// Shared-memory addressing for the PTX wrappers.
//
// Layout contract: every wrapper in src/cuda/ptx/ that touches shared memory takes a 32-bit address
// in the shared state space (the .shared window), not a generic pointer. Converting once per tile
// and adding byte offsets keeps address arithmetic in 32-bit registers inside hot loops.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::ptx {

// cvta.to.shared.u64 (via __cvta_generic_to_shared); any SM. The shared window is < 4 GiB, so the
// address fits in 32 bits, which is what ldmatrix/cp.async expect for a .shared operand.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// st.shared.b32 [addr], x; any SM. A 4-byte store at a computed shared address (a swizzled
// tile's element pair).
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t x) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}

// st.shared.v2.f32 [addr], {x, y}; any SM. addr 8-byte aligned.
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// ld.shared.v2.f32 {x, y}, [addr]; any SM. addr 8-byte aligned.
__device__ __forceinline__ void ld_shared_v2_f32(uint32_t addr, float& x, float& y) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(x), "=f"(y) : "r"(addr) : "memory");
}

}  // namespace fusedattn::cuda::ptx
