// exp2 for the softmax, written so the compiler can vectorise it: libm's exp2f is an opaque
// call that keeps every softmax loop scalar (without -ffast-math, which the project forbids).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace fusedattn::cpu {

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
inline float exp2_approx(float x) {
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
  const float result = poly * scale;
  if (x < static_cast<float>(kMinExponent)) return 0.f;
  if (x > static_cast<float>(kMaxExponent)) return std::numeric_limits<float>::infinity();
  return result;
}

}  // namespace fusedattn::cpu
