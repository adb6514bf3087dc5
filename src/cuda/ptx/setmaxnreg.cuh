// Per-warpgroup register reallocation, sm_90a only; CUDA 13.0's <cuda/ptx> has no wrapper.
//
// Contract: every thread of the warpgroup executes the same instruction (.sync.aligned); the
// count is a multiple of 8 in [24, 256]. It only takes effect when the kernel starts with a
// register cap (__launch_bounds__(threads, 1)), and each role must be one branch of one if/else.
#pragma once

namespace fusedattn::cuda::ptx {

// setmaxnreg.inc.sync.aligned.u32 N; PTX ISA 8.0, sm_90a. Blocks until the registers are free.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// setmaxnreg.dec.sync.aligned.u32 N; PTX ISA 8.0, sm_90a. Returns registers to the pool.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace fusedattn::cuda::ptx
