// The hardware's approximate transcendentals (one MUFU instruction each) that the softmax needs:
// the base-2 exponential of every score, and the reciprocal and base-2 log of each row sum.
//
// Contracts (.ftz: subnormal inputs and results flush to zero; NaN stays NaN):
// - ex2_approx(x) ~ 2^x, at most 2 ulp for normal results; exp2(-inf) = +0 (masked scores rely on
//   it), exp2(+inf) = +inf. Plain exp2f() adds range scaling around the same MUFU.EX2 to keep
//   subnormal results; a softmax weight below 2^-126 is negligible next to the row maximum's 1.
// - rcp_approx(x) ~ 1/x, about 1 ulp; lg2_approx(x) ~ log2(x), 2^-22 absolute. The row sums they
//   take are 0 (handled apart by the callers) or >= 1, so the range handling that __fdividef and
//   __log2f add around the same instructions for subnormal inputs is dead code there.
//
// The exponential goes through the NVVM builtin rather than inline asm: the optimiser then sees
// pure arithmetic it may schedule freely (an asm statement made ptxas spill in the sm80 forward's
// main loop).
#pragma once

#include <cmath>

namespace fusedattn::cuda::ptx {

// ex2.approx.ftz.f32 d, a;   (PTX ISA 1.0, all SMs)
__device__ __forceinline__ float ex2_approx(float x) {
#if defined(__CUDA_ARCH__)
  return __nvvm_ex2_approx_ftz_f(x);
#else
  return exp2f(x);  // the host pass parses device bodies but never runs them; the builtin is device-only
#endif
}

// rcp.approx.ftz.f32 d, a;   (PTX ISA 1.0, all SMs). Inline asm: NVVM has no builtin for it;
// like lg2 it runs once per row in the epilogue, where scheduling freedom does not matter.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// lg2.approx.ftz.f32 d, a;   (PTX ISA 1.0, all SMs)
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fusedattn::cuda::ptx
