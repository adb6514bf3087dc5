// The hardware base-2 exponential (one MUFU.EX2), the inner operation of every softmax.
//
// Contract: ex2_approx(x) ~ 2^x with at most 2 ulp of error for normal results; results that
// would be subnormal flush to +0 (.ftz), exp2(-inf) = +0, exp2(+inf) = +inf, NaN stays NaN.
// Plain exp2f() compiles to extra range-scaling instructions around the same MUFU op to keep
// subnormal results; a softmax weight below 2^-126 is negligible next to the row maximum's 1.
#pragma once

#include <cmath>

namespace fusedattn::cuda::ptx {

// ex2.approx.ftz.f32 d, a;   (PTX ISA 1.0, all SMs)
// Through the NVVM builtin rather than inline asm: the optimiser then sees a pure arithmetic op
// it may schedule freely (an asm statement made ptxas spill in the forward mainloop).
__device__ __forceinline__ float ex2_approx(float x) {
#if defined(__CUDA_ARCH__)
  return __nvvm_ex2_approx_ftz_f(x);
#else
  return exp2f(x);  // the host pass parses device bodies but never runs them; the builtin is device-only
#endif
}

}  // namespace fusedattn::cuda::ptx
