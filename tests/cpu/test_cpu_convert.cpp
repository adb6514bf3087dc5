// The CPU backend's fp16 conversions (src/cpu/convert.h), over all 65536 halves: half_to_float
// against the value its fields spell (computed in double), NaN payloads kept, and float_to_half
// bringing every non-NaN half back exactly.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "cpu/convert.h"

namespace fusedattn::testing {
namespace {

using cpu::FUSEDATTN_CPU_ISA::float_to_half;
using cpu::FUSEDATTN_CPU_ISA::half_to_float;

constexpr int kHalves = 1 << 16;

// The value of half h from its sign, exponent and mantissa fields (IEEE binary16).
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  const double magnitude = exp == 0    ? std::ldexp(mant, -24)
                           : exp == 31 ? (mant == 0 ? INFINITY : NAN)
                                       : std::ldexp(1024 + mant, exp - 25);
  return sign ? -magnitude : magnitude;
}

TEST(CpuConvert, EveryHalfToFloatIsItsValue) {
  for (int i = 0; i < kHalves; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float got = half_to_float(h);
    const double want = half_value(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << i;
      const uint32_t bits = std::bit_cast<uint32_t>(got);
      EXPECT_EQ(bits >> 31, static_cast<uint32_t>(i >> 15)) << "sign of NaN " << std::hex << i;
      EXPECT_EQ((bits >> 13) & 0x3FFu, static_cast<uint32_t>(i & 0x3FF)) << "payload of NaN " << std::hex << i;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << i;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << i;  // -0 stays -0
    }
  }
}

TEST(CpuConvert, EveryHalfComesBackFromItsFloat) {
  for (int i = 0; i < kHalves; ++i) {
    const auto h = static_cast<uint16_t>(i);
    if (std::isnan(half_value(h))) continue;
    ASSERT_EQ(float_to_half(half_to_float(h)), h) << std::hex << i;
  }
}

}  // namespace
}  // namespace fusedattn::testing
