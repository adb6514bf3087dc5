// Windows wider than any sequence: they mean "unbounded" on that side, including values whose
// row + window arithmetic would overflow int64 if a backend used them as given.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "api/validate.h"
#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kHeadDim = 32;
constexpr int64_t kWide = int64_t{1} << 40;  // wider than any sequence, still safe for the reference
constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();

// Runs the forward of c with the window (left, right) and returns out and lse as bytes.
std::pair<std::vector<unsigned char>, std::vector<unsigned char>> forward_with(HostCase& c, int64_t left,
                                                                              int64_t right) {
  c.out.poison();
  c.lse.poison();
  ForwardArgs a = forward_args(c);
  a.options.window_left = left;
  a.options.window_right = right;
  forward(a);
  return {bytes_of(c.out), bytes_of(c.lse)};
}

TEST(CpuWindows, WiderThanTheSequencesMatchesTheReference) {
  for (DType dtype : kCpuDtypes) {
    check_forward(with_mask(dense(2, 2, 1, 70, 90, kHeadDim), false, kWide, 5), dtype);
    check_forward(with_mask(dense(2, 2, 1, 90, 70, kHeadDim), false, 5, kWide), dtype);
    check_backward(with_mask(dense(1, 2, 2, 65, 65, kHeadDim), true, kWide, -1), dtype);
  }
}

// A window bounded on the left starts each query block's key tiles off the score product's pass
// grid, so a block's last tile may be a few keys whose padded pass reads past the transposed copy
// of K (transposed_rows.h): with 1024 keys, blocks of 64 rows and a window of (3, 2), the last
// block's last tile is 5 keys. The sanitized builds (scripts/test_sanitize.sh) turn such a read
// into a failure; here the results must match the reference too.
TEST(CpuWindows, TilesOffThePassGridStayInTheKeyCopy) {
  for (DType dtype : kCpuDtypes) check_forward(with_mask(dense(1, 2, 1, 1024, 1024, kHeadDim), false, 3, 2), dtype);
}

TEST(CpuWindows, Int64MaxMeansUnboundedBitForBit) {
  const Problem p = dense(2, 4, 2, 77, 100, kHeadDim);
  for (DType dtype : kCpuDtypes) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
    const auto unbounded = forward_with(c, -1, -1);
    EXPECT_EQ(forward_with(c, kHuge, kHuge), unbounded) << dtype_name(dtype);
    EXPECT_EQ(forward_with(c, kHuge, -1), unbounded) << dtype_name(dtype);
    EXPECT_EQ(forward_with(c, -1, kHuge), unbounded) << dtype_name(dtype);
    // A one-sided bound stays a bound when the other side is huge.
    EXPECT_EQ(forward_with(c, kHuge, 3), forward_with(c, -1, 3)) << dtype_name(dtype);
  }
}

// A side that excludes no key of any row is folded away exactly at its threshold: left >= Sk - 1
// (the last row's diagonal), right >= Sq - 1 (the first row's); one less is a real bound.
TEST(CpuWindows, BoundsThatExcludeNothingAreFoldedAtTheirThreshold) {
  const int64_t sq = 77, sk = 100;
  const Problem p = dense(2, 4, 2, sq, sk, kHeadDim);
  for (DType dtype : kCpuDtypes) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
    const auto unbounded = forward_with(c, -1, -1);
    EXPECT_EQ(forward_with(c, sk - 1, -1), unbounded) << dtype_name(dtype);
    EXPECT_EQ(forward_with(c, -1, sq - 1), unbounded) << dtype_name(dtype);
    EXPECT_EQ(forward_with(c, sk - 1, sq - 1), unbounded) << dtype_name(dtype);
    check_forward(with_mask(p, false, sk - 2, -1), dtype);
    check_forward(with_mask(p, false, -1, sq - 2), dtype);
  }
}

// The params a backend sees: a decode step's causal mask (one query, which sees its whole cache)
// is no mask, so dispatch takes the full-mask kernels; two queries keep it.
TEST(CpuWindows, ADecodeStepsCausalMaskIsNoMask) {
  for (const int64_t sq : {1, 2}) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(dense(2, 4, 2, sq, 300, kHeadDim), DType::kFloat32, Layout::kBSHD, rng);
    ForwardArgs a = forward_args(c);
    a.options.causal = true;
    FwdParams params;
    Backend backend;
    ASSERT_TRUE(detail::make_fwd_params(a, params, backend));
    EXPECT_EQ(params.is_masked(), sq > 1) << "Sq " << sq;
    EXPECT_EQ(params.window_right, sq > 1 ? 0 : -1) << "Sq " << sq;
  }
}

}  // namespace
}  // namespace fusedattn::testing
