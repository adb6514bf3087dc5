// Tests of the test-side reference itself: dtype rounding, encodings, host tensor layouts, cases
// whose answer is known in closed form, and the plain implementation's error scale. (Its
// backward is checked against finite differences in test_cpu_backward.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {

TEST(Reference, RoundToHalfIsNearestEven) {
  constexpr double kHalfUlpAtOne = 1.0 / 2048;  // half of fp16's 2^-10 spacing above 1
  EXPECT_EQ(round_to(DType::kFloat16, 1.0 + kHalfUlpAtOne), 1.0);  // tie to even (down)
  EXPECT_EQ(round_to(DType::kFloat16, 1.0 + 3 * kHalfUlpAtOne), 1.0 + 4 * kHalfUlpAtOne);  // tie to even (up)
  EXPECT_EQ(round_to(DType::kFloat16, 65504.0), 65504.0);  // the largest finite half
  EXPECT_EQ(round_to(DType::kFloat16, 65519.0), 65504.0);
  EXPECT_EQ(round_to(DType::kFloat16, 65520.0), INFINITY);  // the tie above the max overflows
  EXPECT_EQ(round_to(DType::kFloat16, std::ldexp(1.0, -24)), std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(round_to(DType::kFloat16, std::ldexp(1.0, -25)), 0.0);                   // tie to even zero
  EXPECT_TRUE(std::isnan(round_to(DType::kFloat16, NAN)));
}

TEST(Reference, RoundToBFloat16IsNearestEven) {
  constexpr double kHalfUlpAtOne = 1.0 / 256;
  EXPECT_EQ(round_to(DType::kBFloat16, 1.0 + kHalfUlpAtOne), 1.0);
  EXPECT_EQ(round_to(DType::kBFloat16, 1.0 + 3 * kHalfUlpAtOne), 1.0 + 4 * kHalfUlpAtOne);
  EXPECT_EQ(round_to(DType::kBFloat16, -3.0), -3.0);
  EXPECT_EQ(round_to(DType::kBFloat16, 1e39), INFINITY);
}

TEST(Reference, EncodeDecodeRoundTripsEveryHalfAndBFloat16) {
  constexpr int kPatterns = 1 << 16;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int bits = 0; bits < kPatterns; ++bits) {
      const auto in = static_cast<uint16_t>(bits);
      double x;
      decode(dtype, &in, &x, 1);
      if (std::isnan(x)) continue;  // NaN payloads are not preserved, only NaN-ness
      uint16_t out;
      encode(dtype, &x, &out, 1);
      ASSERT_EQ(out, in) << dtype_name(dtype) << " pattern " << bits << " value " << x;
      ASSERT_EQ(round_to(dtype, x), x) << "a representable value must round to itself";
    }
  }
}

TEST(Reference, HostTensorBHSDIsAPermutedView) {
  const std::vector<int64_t> shape{2, 3, 4, 5};  // [B, S, H, D]
  HostTensor t(DType::kFloat32, shape, Layout::kBHSD);
  std::vector<double> canonical(static_cast<size_t>(t.numel()));
  for (size_t n = 0; n < canonical.size(); ++n) canonical[n] = static_cast<double>(n);
  t.fill(canonical);
  EXPECT_EQ(t.to_double(), canonical);
  const TensorView v = t.view();
  // Element (b, s, h, d) lives at memory ((b*H + h)*S + s)*D + d.
  EXPECT_EQ(v.stride[0], 3 * 4 * 5);
  EXPECT_EQ(v.stride[1], 5);
  EXPECT_EQ(v.stride[2], 3 * 5);
  EXPECT_EQ(v.stride[3], 1);
  const auto* mem = static_cast<const float*>(t.data());
  EXPECT_EQ(mem[v.stride[0] + 2 * v.stride[1] + 3 * v.stride[2] + 4], canonical[((1 * 3 + 2) * 4 + 3) * 5 + 4]);
  t.poison();
  for (double x : t.to_double()) EXPECT_TRUE(std::isnan(x));
}

TEST(Reference, OneVisibleKeyCopiesItsValue) {
  // A zero-width window: row i sees key i only, so out = v_i and lse = scale q_i . k_i.
  Problem p = with_mask(dense(1, 1, 1, 5, 5, 3), false, 0, 0);
  std::mt19937_64 rng = fresh_rng();
  Tensors t;
  t.q = randn(rng, 15, 1.0, DType::kFloat32);
  t.k = randn(rng, 15, 1.0, DType::kFloat32);
  t.v = randn(rng, 15, 1.0, DType::kFloat32);
  reference_forward(p, t);
  for (int i = 0; i < 5; ++i) {
    double dot = 0;
    for (int d = 0; d < 3; ++d) {
      EXPECT_DOUBLE_EQ(t.out[i * 3 + d], t.v[i * 3 + d]);
      dot += t.q[i * 3 + d] * t.k[i * 3 + d];
    }
    EXPECT_NEAR(t.lse[i], p.scale() * dot, 1e-15);
  }
}

TEST(Reference, EqualScoresAverageTheValues) {
  // q = 0: every score is 0, so out is the mean of the visible values and lse = log(count).
  Problem p = with_mask(dense(1, 1, 1, 3, 4, 2), true, -1, -1);  // rows see 2, 3 and 4 keys
  std::mt19937_64 rng = fresh_rng();
  Tensors t;
  t.q.assign(6, 0.0);
  t.k = randn(rng, 8, 1.0, DType::kFloat32);
  t.v = randn(rng, 8, 1.0, DType::kFloat32);
  reference_forward(p, t);
  for (int i = 0; i < 3; ++i) {
    const int count = i + 2;
    for (int d = 0; d < 2; ++d) {
      double mean = 0;
      for (int j = 0; j < count; ++j) mean += t.v[j * 2 + d] / count;
      EXPECT_NEAR(t.out[i * 2 + d], mean, 1e-15);
    }
    EXPECT_NEAR(t.lse[i], std::log(count), 1e-15);
  }
}

TEST(Reference, MaskRuleIsBottomRightAligned) {
  // Sq = 2, Sk = 5, causal: row 0 sees keys 0..3, row 1 sees 0..4 (the last rows line up).
  // With a left window of 1 row 0 sees keys 2..3 only.
  Problem p = with_mask(dense(1, 1, 1, 2, 5, 1), true, 1, -1);
  Tensors t;
  t.q = {0.0, 0.0};
  t.k.assign(5, 0.0);
  t.v = {1, 10, 100, 1000, 10000};
  reference_forward(p, t);
  EXPECT_DOUBLE_EQ(t.out[0], (100 + 1000) / 2.0);
  EXPECT_DOUBLE_EQ(t.out[1], (1000 + 10000) / 2.0);
}

TEST(Reference, FullyMaskedRowsAreZeroWithMinusInfLse) {
  Problem p = with_mask(dense(1, 2, 1, 6, 2, 4), true, -1, -1);  // rows 0..3 see nothing
  std::mt19937_64 rng = fresh_rng();
  Tensors t;
  t.q = randn(rng, 6 * 2 * 4, 1.0, DType::kFloat32);
  t.k = randn(rng, 2 * 4, 1.0, DType::kFloat32);
  t.v = randn(rng, 2 * 4, 1.0, DType::kFloat32);
  t.dout = randn(rng, 6 * 2 * 4, 1.0, DType::kFloat32);
  reference_forward(p, t);
  reference_backward(p, t);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(std::isinf(t.lse[lse_offset(p, 0, h, i)]), i < 4);
      for (int d = 0; d < 4; ++d) {
        if (i < 4) EXPECT_EQ(t.out[out_offset(p, 0, h, i) + d], 0.0);
        if (i < 4) EXPECT_EQ(t.dq[out_offset(p, 0, h, i) + d], 0.0);
      }
    }
}

TEST(Reference, PlainErrorShrinksWithPrecision) {
  // The 2x rule's bar only means something if the plain implementation is a faithful low-
  // precision computation: its error must order bf16 > fp16 > fp32 and stay near each ulp.
  const Problem p = dense(1, 2, 2, 64, 80, 32);
  std::mt19937_64 rng = fresh_rng();
  Tensors t;
  // bf16 values are also fp16 and fp32 values (bar tiny fp16 subnormals): all three see the same data.
  t.q = randn(rng, 64 * 2 * 32, 1.0, DType::kBFloat16);
  t.k = randn(rng, 80 * 2 * 32, 1.0, DType::kBFloat16);
  t.v = randn(rng, 80 * 2 * 32, 1.0, DType::kBFloat16);
  Tensors ref = t;
  reference_forward(p, ref);
  double err[3];
  const DType dtypes[3] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
  for (int n = 0; n < 3; ++n) {
    Tensors x = t;
    plain_forward(p, dtypes[n], x);
    err[n] = compare(x.out, ref.out).max_abs;
  }
  EXPECT_GT(err[0], err[1]);
  EXPECT_GT(err[1], err[2]);
  EXPECT_LT(err[0], 0.05);
  EXPECT_LT(err[1], 0.005);
  EXPECT_LT(err[2], 1e-5);
}

// The FlashAttention model differs from the reference only through delta = dO . O: over the exact
// output it is the reference (to float64 rounding), over a rounded one dq and dk move and dv not.
TEST(Reference, BackwardOverStoredOutMovesOnlyDelta) {
  const Problem p = dense(1, 2, 1, 40, 56, 32);
  std::mt19937_64 rng = fresh_rng();
  const Tensors t = make_case(p, DType::kFloat32, Layout::kBSHD, rng).values;
  Tensors ref = t;
  reference_forward(p, ref);
  reference_backward(p, ref);
  constexpr double kFloat64Sums = 1e-12;
  Tensors exact = t;
  reference_backward_over_stored_out(p, exact, ref.out);
  EXPECT_LT(compare(exact.dq, ref.dq).max_abs, kFloat64Sums);
  EXPECT_LT(compare(exact.dk, ref.dk).max_abs, kFloat64Sums);
  EXPECT_EQ(exact.dv, ref.dv);
  std::vector<double> stored = ref.out;
  for (double& x : stored) x = round_to(DType::kBFloat16, x);
  Tensors rounded = t;
  reference_backward_over_stored_out(p, rounded, stored);
  EXPECT_GT(compare(rounded.dq, ref.dq).max_abs, kFloat64Sums);
  EXPECT_GT(compare(rounded.dk, ref.dk).max_abs, kFloat64Sums);
  EXPECT_EQ(rounded.dv, ref.dv);
}

TEST(Reference, CompareCountsNonFiniteMismatches) {
  const std::vector<double> ref{1.0, NAN, INFINITY, -INFINITY, 2.0};
  EXPECT_EQ(compare(ref, ref).mismatched_nonfinite, 0);
  EXPECT_EQ(compare(ref, ref).max_abs, 0.0);
  const std::vector<double> got{1.0, 0.0, -INFINITY, -INFINITY, NAN};
  const ErrorStats e = compare(got, ref);
  EXPECT_EQ(e.mismatched_nonfinite, 3);
  EXPECT_TRUE(std::isinf(e.max_abs));
  std::string message;
  EXPECT_FALSE(within_2x_rule(got, ref, ref, 1.0, &message));
  EXPECT_FALSE(message.empty());
}

TEST(Reference, TwoXRuleBoundary) {
  const std::vector<double> ref{0.0, 1.0}, plain{0.0, 1.1};
  EXPECT_TRUE(within_2x_rule({0.0, 1.2}, plain, ref, 0.01, nullptr));
  EXPECT_FALSE(within_2x_rule({0.0, 1.25}, plain, ref, 0.01, nullptr));
}

// A plain result that overflows where the reference is finite would make the bound infinite.
TEST(Reference, TwoXRuleCannotJudgeANonFinitePlainResult) {
  const std::vector<double> ref{0.0, 1.0}, plain{0.0, INFINITY};
  std::string message;
  EXPECT_FALSE(within_2x_rule({0.0, 5.0}, plain, ref, 0.01, &message));
  EXPECT_NE(message.find("non-finite mismatches 1"), std::string::npos) << message;
}

TEST(Reference, FreshRngGivesNewValuesEachCall) {
  std::mt19937_64 a = fresh_rng(), b = fresh_rng();
  EXPECT_NE(a(), b());
}

}  // namespace
}  // namespace fusedattn::testing
