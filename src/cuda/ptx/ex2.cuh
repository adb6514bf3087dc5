// The hardware base-2 exponential (one MUFU.EX2), the inner operation of every softmax.
//
// Contract: ex2_approx(x) ~ 2^x with at most 2 ulp of error for normal results; results that
// would be subnormal flush to +0 (.ftz), exp2(-inf) = +0, exp2(+inf) = +inf, NaN stays NaN.
// Plain exp2f() compiles to extra range-scaling instructions around the same MUFU op to keep
// subnormal results; a softmax weight below 2^-126 is negligible next to the row maximum's 1.
#pragma once

namespace fusedattn::cuda::ptx {

// ex2.approx.ftz.f32 d, a;   (PTX ISA 1.0, all SMs)
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fusedattn::cuda::ptx
