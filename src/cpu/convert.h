// Storage dtypes <-> float. fp16 and bf16 are converted by hand, rounding to nearest even, so
// the CPU backend needs no compiler extension (_Float16, __bf16) and no external library.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "cpu/isa.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// ---- IEEE binary16 -------------------------------------------------------------------------
inline constexpr uint32_t kF32SignMask = 0x80000000u;
inline constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kF32InfBits = 0x7F800000u;
inline constexpr int kF32MantBits = 23;
inline constexpr int kF16MantBits = 10;
inline constexpr int kMantShift = kF32MantBits - kF16MantBits;  // 13
inline constexpr uint16_t kF16SignMask = 0x8000u;
inline constexpr uint16_t kF16AbsMask = 0x7FFFu;
inline constexpr uint16_t kF16ExpMask = 0x1Fu;      // after shifting the exponent down
inline constexpr uint16_t kF16MantMask = 0x3FFu;
inline constexpr uint16_t kF16InfBits = 0x7C00u;
inline constexpr uint16_t kF16QuietBit = 0x0200u;
inline constexpr uint32_t kExpBiasDelta = 127 - 15;  // float bias minus half bias
// Smallest float that rounds to +inf in half: 65504 + half an ulp (16) = 65520.
inline constexpr uint32_t kF16OverflowBits = 0x477FF000u;
// 2^-14, the smallest normal half; below it halves are subnormal multiples of 2^-24.
inline constexpr uint32_t kF16MinNormalBits = 0x38800000u;
inline constexpr float kF16InvSubnormalUlp = 0x1p24f;

// Without branches, so that a loop of them vectorises (a decode step over fp16 caches converts
// every key and value once): the exponent and mantissa shifted into place and rebiased; an
// all-ones exponent (inf, NaN: payload kept) rebiased once more to 255; a zero one (zero,
// subnormals) given the smallest normal exponent, then 2^-14 taken off, which is exact and leaves
// mant * 2^-24.
inline constexpr uint32_t kF16ShiftedExp = uint32_t{kF16ExpMask} << (kF16MantBits + kMantShift);
inline constexpr uint32_t kF32MinNormalExp = uint32_t{1} << kF32MantBits;
inline constexpr float kF16MinNormal = 0x1p-14f;

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & kF16SignMask) << 16;
  const uint32_t shifted = static_cast<uint32_t>(h & kF16AbsMask) << kMantShift;
  const uint32_t exp = shifted & kF16ShiftedExp;
  const uint32_t rebiased = shifted + (kExpBiasDelta << kF32MantBits);
  const uint32_t special = rebiased + (kExpBiasDelta << kF32MantBits);  // 0x1F + 224 = 255
  const float subnormal = std::bit_cast<float>(rebiased + kF32MinNormalExp) - kF16MinNormal;
  const uint32_t magnitude =
      exp == kF16ShiftedExp ? special : (exp == 0 ? std::bit_cast<uint32_t>(subnormal) : rebiased);
  return std::bit_cast<float>(magnitude | sign);
}

inline uint16_t float_to_half(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((bits & kF32SignMask) >> 16);
  const uint32_t abs = bits & kF32AbsMask;
  if (abs > kF32InfBits)  // NaN: keep the top payload bits and force a quiet NaN
    return static_cast<uint16_t>(sign | kF16InfBits | kF16QuietBit | ((abs >> kMantShift) & kF16MantMask));
  if (abs >= kF16OverflowBits) return static_cast<uint16_t>(sign | kF16InfBits);
  if (abs >= kF16MinNormalBits) {
    // Rebias, then round the 13 dropped bits to nearest even; a mantissa carry correctly bumps
    // the exponent (and 65504 < x < 65520 cannot reach inf, excluded above).
    uint32_t r = abs - (kExpBiasDelta << kF32MantBits);
    r += ((1u << (kMantShift - 1)) - 1) + ((r >> kMantShift) & 1u);
    return static_cast<uint16_t>(sign | (r >> kMantShift));
  }
  // Subnormal or zero: the half is round(x / 2^-24); the scaling is exact, nearbyint rounds to
  // even in the default rounding mode, and 1024 lands exactly on the smallest normal.
  const float units = std::nearbyint(std::bit_cast<float>(abs) * kF16InvSubnormalUlp);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
}

// ---- bfloat16: the top half of a float -----------------------------------------------------
inline constexpr int kBf16Shift = 16;
inline constexpr uint32_t kBf16QuietBit = 0x0040u;

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << kBf16Shift); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & kF32AbsMask) > kF32InfBits)  // NaN: truncating could clear every payload bit
    return static_cast<uint16_t>((bits >> kBf16Shift) | kBf16QuietBit);
  const uint32_t round_bias = ((1u << (kBf16Shift - 1)) - 1) + ((bits >> kBf16Shift) & 1u);
  return static_cast<uint16_t>((bits + round_bias) >> kBf16Shift);
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
