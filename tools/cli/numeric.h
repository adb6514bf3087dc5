// Storage dtypes on the host: fp16 and bf16 bit conversions (round to nearest even), and element
// loads/stores in any of the tool's dtypes. The CLI needs them to make inputs and to read outputs
// without depending on the test library.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fusedattn/tensor.h"

namespace fusedattn::cli::numeric {

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr int kF32MantissaBits = 23;

constexpr int kF16MantissaBits = 10;
constexpr uint16_t kF16Inf = 0x7C00;
constexpr uint16_t kF16QuietNaN = 0x7E00;
constexpr uint16_t kF16MantissaMask = 0x03FF;
constexpr int kF16ExpMask = 0x1F;
// fp32 and fp16 exponent biases differ by 127 - 15.
constexpr uint32_t kF16RebiasExp = 127 - 15;
// Smallest fp32 magnitude that rounds to fp16 infinity: 65520 is the tie between the largest
// finite fp16 (65504, odd mantissa) and 2^16, and ties go to even, i.e. up.
constexpr uint32_t kF16OverflowBits = 0x477FF000u;
// 2^-14: below it fp16 values are subnormal, multiples of 2^-24.
constexpr uint32_t kF16MinNormalBits = 0x38800000u;
constexpr float kF16SubnormalScale = 16777216.0f;  // 2^24

constexpr uint16_t kBF16QuietNaN = 0x7FC0;
constexpr int kBF16Shift = 16;  // bf16 is the top half of an fp32

inline uint16_t float_to_half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x & kF32SignMask) >> 16);
  const uint32_t ax = x & kF32AbsMask;
  if (ax > kF32Inf) return sign | kF16QuietNaN;
  if (ax >= kF16OverflowBits) return sign | kF16Inf;
  if (ax < kF16MinNormalBits) {
    // Scaling by 2^24 is exact, so nearbyint (round to nearest even) rounds exactly once; a result
    // of 1024 is the bit pattern of the smallest normal fp16, which is also correct.
    const float units = std::nearbyint(std::bit_cast<float>(ax) * kF16SubnormalScale);
    return sign | static_cast<uint16_t>(units);
  }
  const int drop = kF32MantissaBits - kF16MantissaBits;
  const uint32_t half_ulp_minus_one = (1u << (drop - 1)) - 1;
  const uint32_t odd = (ax >> drop) & 1u;  // ties to even
  const uint32_t rounded = ax + half_ulp_minus_one + odd;
  return sign | static_cast<uint16_t>((rounded - (kF16RebiasExp << kF32MantissaBits)) >> drop);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exp = (h >> kF16MantissaBits) & kF16ExpMask;
  const uint32_t mant = h & kF16MantissaMask;
  const int drop = kF32MantissaBits - kF16MantissaBits;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) / kF16SubnormalScale;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  if (exp == kF16ExpMask) return std::bit_cast<float>(sign | kF32Inf | (mant << drop));
  return std::bit_cast<float>(sign | ((exp + kF16RebiasExp) << kF32MantissaBits) | (mant << drop));
}

inline uint16_t float_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & kF32AbsMask) > kF32Inf) return static_cast<uint16_t>((x & kF32SignMask) >> kBF16Shift) | kBF16QuietNaN;
  const uint32_t odd = (x >> kBF16Shift) & 1u;  // ties to even
  const uint32_t half_ulp_minus_one = (1u << (kBF16Shift - 1)) - 1;
  return static_cast<uint16_t>((x + half_ulp_minus_one + odd) >> kBF16Shift);
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << kBF16Shift); }

// Element `index` of an array of `dtype` values, as a double.
inline double load(DType dtype, const void* base, int64_t index) {
  switch (dtype) {
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return static_cast<const float*>(base)[index];
  }
}

inline void store(DType dtype, void* base, int64_t index, double value) {
  const auto f = static_cast<float>(value);
  switch (dtype) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[index] = float_to_half(f); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[index] = float_to_bf16(f); break;
    default: static_cast<float*>(base)[index] = f; break;
  }
}

// `value` rounded to `dtype` (through fp32, as a kernel's conversion instructions do).
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat16: return half_to_float(float_to_half(value));
    case DType::kBFloat16: return bf16_to_float(float_to_bf16(value));
    default: return value;
  }
}

// Relative rounding step of a dtype (2^-mantissa bits), used to scale tolerances.
inline double epsilon(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return std::ldexp(1.0, -10);
    case DType::kBFloat16: return std::ldexp(1.0, -7);
    default: return std::ldexp(1.0, -23);
  }
}

}  // namespace fusedattn::cli::numeric
