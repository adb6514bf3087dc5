// Storage-dtype rounding and encoding, random inputs, and error statistics. Written from the
// IEEE-754 definitions so that the tests do not share a conversion routine with any backend.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "reference/reference.h"

namespace fusedattn::testing {
namespace {

// A binary floating-point format described by what rounding needs.
struct Format {
  int precision;     // significand bits, the implicit leading one included
  int min_exponent;  // exponent of the smallest normal number (below it: subnormals)
  int max_exponent;  // exponent of the largest finite number
  double max_finite() const { return std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), max_exponent); }
};
constexpr Format kHalf{11, -14, 15};
constexpr Format kBFloat16{8, -126, 127};

// 2^e for a normal double's exponent (-1022..1023), from its bits: what std::ldexp(1.0, e) gives,
// without a library call per element. Rounding into fp16/bf16 asks for exponents within -1016..1016.
constexpr int kDoubleExponentBias = 1023, kDoubleMantissaBits = 52;
double power_of_two(int e) {
  return std::bit_cast<double>(static_cast<uint64_t>(e + kDoubleExponentBias) << kDoubleMantissaBits);
}

// Round-to-nearest-even of x into `f`, overflow to +-inf, computed exactly in double.
double round_to_format(double x, const Format& f) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  const int exponent = std::max(std::ilogb(a), f.min_exponent);
  const int ulp_exponent = exponent - (f.precision - 1);
  // a * 2^-ulp_exponent is exact (a power-of-two scaling); rint rounds in the default ties-to-even
  // mode (as nearbyint does, which also saves and restores the floating-point environment: twice
  // the time of the whole call, and the plain implementation rounds every score and probability).
  double r = std::rint(a * power_of_two(-ulp_exponent)) * power_of_two(ulp_exponent);
  if (exponent >= f.max_exponent && r > f.max_finite()) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

constexpr uint16_t kHalfExponentMask = 0x7c00;
constexpr uint16_t kHalfMantissaMask = 0x03ff;
constexpr uint16_t kHalfSignMask = 0x8000;
constexpr uint16_t kHalfQuietNaN = 0x7e00;
constexpr int kHalfMantissaBits = 10;
constexpr int kHalfExponentBias = 15;
constexpr int kHalfSubnormalExponent = -24;  // value of the last mantissa bit of a subnormal
constexpr int kBFloat16Shift = 16;           // bf16 is the upper half of an fp32
constexpr uint16_t kBFloat16QuietNaN = 0x7fc0;

uint16_t half_bits(double x) {
  if (std::isnan(x)) return kHalfQuietNaN;
  const double r = round_to_format(x, kHalf);
  const uint16_t sign = std::signbit(r) ? kHalfSignMask : 0;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | kHalfExponentMask;
  if (a == 0.0) return sign;
  const int e = std::ilogb(a);
  if (e < kHalf.min_exponent)
    return sign | static_cast<uint16_t>(std::ldexp(a, -kHalfSubnormalExponent));
  const auto mantissa = static_cast<uint16_t>(std::ldexp(std::ldexp(a, -e) - 1.0, kHalfMantissaBits));
  return sign | static_cast<uint16_t>((e + kHalfExponentBias) << kHalfMantissaBits) | mantissa;
}

double half_value(uint16_t bits) {
  const double sign = (bits & kHalfSignMask) ? -1.0 : 1.0;
  const int exponent = (bits & kHalfExponentMask) >> kHalfMantissaBits;
  const int mantissa = bits & kHalfMantissaMask;
  if (exponent == kHalfExponentMask >> kHalfMantissaBits)
    return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, kHalfSubnormalExponent);
  return sign * std::ldexp(1.0 + std::ldexp(mantissa, -kHalfMantissaBits), exponent - kHalfExponentBias);
}

uint16_t bfloat16_bits(double x) {
  if (std::isnan(x)) return kBFloat16QuietNaN;
  // Every bf16 value is an fp32 value, so the rounded result converts to float exactly.
  const float f = static_cast<float>(round_to_format(x, kBFloat16));
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> kBFloat16Shift);
}

double bfloat16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << kBFloat16Shift;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

[[noreturn]] void unsupported(DType dtype) {
  throw std::invalid_argument(std::string("reference: no host conversion for dtype ") + dtype_name(dtype));
}

bool same_nonfinite(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b;  // both infinite here: same sign
}

}  // namespace

double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::kFloat16: return round_to_format(x, kHalf);
    case DType::kBFloat16: return round_to_format(x, kBFloat16);
    case DType::kFloat32: return static_cast<float>(x);  // the C++ conversion rounds to nearest even
    default: unsupported(dtype);
  }
}

void encode(DType dtype, const double* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat16: static_cast<uint16_t*>(dst)[i] = half_bits(src[i]); break;
      case DType::kBFloat16: static_cast<uint16_t*>(dst)[i] = bfloat16_bits(src[i]); break;
      case DType::kFloat32: static_cast<float*>(dst)[i] = static_cast<float>(src[i]); break;
      case DType::kInt32: static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(src[i]); break;
      default: unsupported(dtype);
    }
  }
}

void decode(DType dtype, const void* src, double* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kFloat16: dst[i] = half_value(static_cast<const uint16_t*>(src)[i]); break;
      case DType::kBFloat16: dst[i] = bfloat16_value(static_cast<const uint16_t*>(src)[i]); break;
      case DType::kFloat32: dst[i] = static_cast<const float*>(src)[i]; break;
      case DType::kInt32: dst[i] = static_cast<const int32_t*>(src)[i]; break;
      default: unsupported(dtype);
    }
  }
}

std::vector<double> randn(std::mt19937_64& rng, int64_t n, double stddev, DType dtype) {
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> values(static_cast<size_t>(n));
  for (double& x : values) x = round_to(dtype, normal(rng));
  return values;
}

ErrorStats compare(const std::vector<double>& got, const std::vector<double>& ref) {
  if (got.size() != ref.size())
    throw std::invalid_argument("compare: " + std::to_string(got.size()) + " values against " +
                                std::to_string(ref.size()) + " reference values");
  ErrorStats stats;
  double diff_sq = 0, ref_sq = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      if (!same_nonfinite(a, b)) ++stats.mismatched_nonfinite;
      continue;
    }
    const double d = std::fabs(a - b);
    stats.max_abs = std::max(stats.max_abs, d);
    diff_sq += d * d;
    ref_sq += b * b;
  }
  if (stats.mismatched_nonfinite > 0) stats.max_abs = std::numeric_limits<double>::infinity();
  stats.rel_l2 = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : (diff_sq > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  return stats;
}

bool within_2x_rule(const std::vector<double>& got, const std::vector<double>& plain,
                    const std::vector<double>& ref, double atol, std::string* message) {
  constexpr double kAllowedFactor = 2.0;
  const ErrorStats g = compare(got, ref);
  const ErrorStats p = compare(plain, ref);
  const double bound = kAllowedFactor * p.max_abs + atol;
  // A plain result that overflows (or turns NaN) where the reference does not makes the bound
  // infinite, which would pass anything: the rule cannot judge such a case, so it fails.
  const bool ok = g.mismatched_nonfinite == 0 && p.mismatched_nonfinite == 0 && g.max_abs <= bound;
  if (message) {
    std::ostringstream s;
    s << "max|got-ref| = " << g.max_abs << " (rel_l2 " << g.rel_l2 << ", non-finite mismatches "
      << g.mismatched_nonfinite << "), max|plain-ref| = " << p.max_abs << " (rel_l2 " << p.rel_l2
      << ", non-finite mismatches " << p.mismatched_nonfinite << "), bound 2*plain + " << atol << " = " << bound;
    *message = s.str();
  }
  return ok;
}

}  // namespace fusedattn::testing
