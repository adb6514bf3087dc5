// exp2 for the softmax, in a scalar and a vector (simd.h) form: libm's exp2f is an opaque call
// that keeps every softmax loop scalar, and without -ffast-math (which the project forbids) GCC
// will not if-convert the selects of a scalar version inside a loop, so the vector form is
// spelled out.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#include "cpu/isa.h"
#include "cpu/simd.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

namespace exp2_detail {
inline constexpr double kLn2 = 0.69314718055994530942;
inline constexpr int kDegree = 7;
// Taylor coefficients of 2^f = e^(f ln2): (ln2)^k / k!. On |f| <= 1/2 the first dropped term is
// (ln2/2)^8 / 8! < 6e-9, well below float's 6e-8 half-ulp, so no minimax fit is needed.
constexpr float coefficient(int k) {
  double c = 1.0;
  for (int i = 1; i <= k; ++i) c *= kLn2 / i;
  return static_cast<float>(c);
}
// Adding 1.5 * 2^23 rounds |x| < 2^22 to an integer held in the low mantissa bits.
inline constexpr float kRoundMagic = 0x1.8p23f;
inline constexpr int kMinExponent = -126;  // below: the result is subnormal, flushed to 0
inline constexpr int kMaxExponent = 127;
inline constexpr uint32_t kFloatBias = 127;
inline constexpr int kMantBits = 23;
}  // namespace exp2_detail

// 2^x for x <= 127: about 1 ulp on [-126, 127]; exactly 0 below -126 (so -inf gives 0, which is
// what masked scores need); +inf above 127; NaN stays NaN. Softmax callers only pass x <= ~0.
FUSEDATTN_CPU_INLINE float exp2_approx(float x) {
  using namespace exp2_detail;
  // The clamps compare with `<`/`>` so a NaN x falls through unchanged.
  float xc = x < static_cast<float>(kMinExponent) ? static_cast<float>(kMinExponent) : x;
  xc = xc > static_cast<float>(kMaxExponent) ? static_cast<float>(kMaxExponent) : xc;
  const float shifted = xc + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const float f = xc - n;  // in [-1/2, 1/2]
  // Horner, written out: a loop here would stop the caller's loop from being vectorised.
  static_assert(kDegree == 7, "the Horner chain below spells out degree 7");
  const float poly =
      ((((((coefficient(7) * f + coefficient(6)) * f + coefficient(5)) * f + coefficient(4)) * f + coefficient(3)) * f +
        coefficient(2)) * f + coefficient(1)) * f + coefficient(0);
  // The integer n, read from the mantissa bits (no float->int conversion, which NaN would make UB).
  // Unsigned arithmetic wraps, so even a NaN's bits cannot overflow; n + bias is in [1, 254].
  const uint32_t biased = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRoundMagic) + kFloatBias;
  const float scale = std::bit_cast<float>(biased << kMantBits);
  // Selects between values already computed, not branches, so the loops calling this stay
  // vectorisable (with trapping math on, GCC will not hoist arithmetic out of a conditional arm).
  const float value = poly * scale;
  const float result = x < static_cast<float>(kMinExponent) ? 0.f : value;
  return x > static_cast<float>(kMaxExponent) ? std::numeric_limits<float>::infinity() : result;
}

// The inputs a caller may pass: any float, or only x <= 0 (the forward softmax's scores less their
// maximum), where 2^x cannot overflow and the vector form leaves out the upper clamp and the +inf
// select (4 of its ~22 operations; exp2 was ~12% of the fp32 forward's samples).
enum class Exp2Inputs { kAny, kNonPositive };

// The same function on kVecWidth lanes; each lane gives exactly what exp2_approx(float) gives
// (for kNonPositive, on the x <= 0 it admits).
template <Exp2Inputs kInputs = Exp2Inputs::kAny>
FUSEDATTN_CPU_INLINE Vec exp2_approx(Vec x) {
  using namespace exp2_detail;
  typedef uint32_t UVec __attribute__((vector_size(sizeof(Vec))));
  const Vec lo = broadcast(static_cast<float>(kMinExponent)), hi = broadcast(static_cast<float>(kMaxExponent));
  const Vec magic = broadcast(kRoundMagic);
  Vec xc = x < lo ? lo : x;
  if constexpr (kInputs == Exp2Inputs::kAny) xc = xc > hi ? hi : xc;
  const Vec shifted = xc + magic;
  const Vec n = shifted - magic;
  const Vec f = xc - n;
  const Vec poly =
      ((((((coefficient(7) * f + coefficient(6)) * f + coefficient(5)) * f + coefficient(4)) * f + coefficient(3)) * f +
        coefficient(2)) * f + coefficient(1)) * f + coefficient(0);
  const UVec biased = std::bit_cast<UVec>(shifted) - std::bit_cast<UVec>(magic) + kFloatBias;
  const Vec value = poly * std::bit_cast<Vec>(biased << kMantBits);
  const Vec result = x < lo ? broadcast(0.f) : value;
  if constexpr (kInputs == Exp2Inputs::kNonPositive) return result;
  return x > hi ? broadcast(std::numeric_limits<float>::infinity()) : result;
}

// x[j] = exp2(x[j] * mul - sub) for j < n (kNonPositive: each x[j] * mul - sub is <= 0).
template <Exp2Inputs kInputs = Exp2Inputs::kAny>
FUSEDATTN_CPU_INLINE void exp2_scaled(float* x, int n, float mul, float sub) {
  // Scalar operands: GCC broadcasts them with one instruction (simd.h, broadcast).
  int j = 0;
  for (; j + kVecWidth <= n; j += kVecWidth) store_vec(x + j, exp2_approx<kInputs>(load_vec(x + j) * mul - sub));
  for (; j < n; ++j) x[j] = exp2_approx(x[j] * mul - sub);
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
