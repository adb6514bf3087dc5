// CPU backward against the float64 reference's gradients, and finite-difference checks that tie
// the reference backward (and the fp32 CPU backward) to the derivative of the reference forward.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/backward_plan.h"
#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kDefaultHeadDim = 64;

void check_all_dtypes(const Problem& p, Layout layout = Layout::kBSHD) {
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
    check_backward(p, dtype, layout);
  }
}

TEST(CpuBackward, SeqlensNotMultipleOf64) {
  for (int64_t s : {1, 17, 100}) check_all_dtypes(dense(2, 2, 2, s, s, kDefaultHeadDim));
}

TEST(CpuBackward, SqNotEqualSk) {
  check_all_dtypes(dense(1, 2, 2, 100, 37, kDefaultHeadDim));
  check_all_dtypes(dense(1, 2, 2, 37, 100, kDefaultHeadDim));
}

TEST(CpuBackward, Causal) {
  check_all_dtypes(with_mask(dense(2, 2, 2, 100, 100, kDefaultHeadDim), true, -1, -1));
  check_all_dtypes(with_mask(dense(1, 2, 2, 40, 90, kDefaultHeadDim), true, -1, -1));
  // Sq > Sk: the first rows are fully masked and must contribute no gradient (lse = -inf).
  check_all_dtypes(with_mask(dense(1, 2, 2, 90, 40, kDefaultHeadDim), true, -1, -1));
}

TEST(CpuBackward, Windows) {
  check_all_dtypes(with_mask(dense(1, 2, 2, 100, 100, kDefaultHeadDim), false, 12, -1));
  check_all_dtypes(with_mask(dense(1, 2, 2, 70, 100, kDefaultHeadDim), false, -1, 6));
  check_all_dtypes(with_mask(dense(1, 2, 2, 100, 70, kDefaultHeadDim), false, 5, 9));
  check_all_dtypes(with_mask(dense(1, 2, 2, 100, 100, kDefaultHeadDim), true, 20, -1));
}

TEST(CpuBackward, GqaAndMqaSumOverTheGroup) {
  check_all_dtypes(dense(1, 8, 2, 60, 70, kDefaultHeadDim));
  check_all_dtypes(with_mask(dense(2, 4, 1, 70, 60, kDefaultHeadDim), true, -1, -1));
}

TEST(CpuBackward, VarlenWithEmptySequences) {
  const Problem p = packed(4, 2, kDefaultHeadDim, {17, 0, 64, 100, 1}, {33, 5, 0, 100, 40});
  check_all_dtypes(p);
  check_all_dtypes(with_mask(p, true, -1, -1));
}

TEST(CpuBackward, LayoutBHSD) {
  check_all_dtypes(dense(2, 4, 2, 70, 50, kDefaultHeadDim), Layout::kBHSD);
  check_all_dtypes(with_mask(dense(1, 2, 2, 50, 70, kDefaultHeadDim), false, 10, 3), Layout::kBHSD);
}

TEST(CpuBackward, HeadDims) {
  for (int d : {1, 8, 40, 80, 128, 256}) check_all_dtypes(with_mask(dense(1, 2, 1, 45, 66, d), true, -1, -1));
}

TEST(CpuBackward, DeterministicFlagIsCorrect) {
  const Problem p = with_mask(dense(1, 4, 2, 90, 90, kDefaultHeadDim), true, -1, -1);
  for (DType dtype : kCpuDtypes) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
    run_forward(c);
    run_backward(c, /*deterministic=*/true);
    const auto dq = c.dq.to_double(), dk = c.dk.to_double(), dv = c.dv.to_double();
    Tensors ref = c.values;
    reference_backward(p, ref);
    Tensors plain = c.values;
    if (dtype != DType::kFloat32) plain_backward(p, dtype, plain);
    expect_matches("dq", dtype, dq, ref.dq, plain.dq, kFp32GradAtol, kFp32GradRtol, atol_for(dtype), case_name(c));
    expect_matches("dk", dtype, dk, ref.dk, plain.dk, kFp32GradAtol, kFp32GradRtol, atol_for(dtype), case_name(c));
    expect_matches("dv", dtype, dv, ref.dv, plain.dv, kFp32GradAtol, kFp32GradRtol, atol_for(dtype), case_name(c));
  }
}

TEST(CpuBackward, BackwardWorkspaceIsZeroOnTheCpu) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(dense(1, 2, 2, 10, 10, kDefaultHeadDim), DType::kFloat32, Layout::kBSHD, rng);
  EXPECT_EQ(backward_workspace_bytes(backward_args(c)), 0u);
}

// The plan rule (backward_plan.h): fused where one task per (batch, KV head) keeps the threads at
// least 3/4 busy and its dQ rows fit; the switch overrides the rule but not the memory bound.
TEST(CpuBackwardPlan, FusesWhereTheTasksKeepTheThreadsBusy) {
  using cpu::FUSEDATTN_CPU_ISA::fuses_dq;
  using cpu::FUSEDATTN_CPU_ISA::kFusedBackwardSwitch;
  using cpu::FUSEDATTN_CPU_ISA::kMaxFusedRowBytes;
  const ScopedEnv unset(kFusedBackwardSwitch, "");
  constexpr int64_t kSmall = 1 << 20;
  EXPECT_TRUE(fuses_dq(1, 1, kSmall));
  EXPECT_TRUE(fuses_dq(8, 2, kSmall));
  EXPECT_TRUE(fuses_dq(3, 4, kSmall));    // one round, 3 of 4 threads busy
  EXPECT_FALSE(fuses_dq(1, 2, kSmall));   // half the threads idle
  EXPECT_FALSE(fuses_dq(5, 4, kSmall));   // the second round keeps 1 of 4 busy: 5/8
  EXPECT_FALSE(fuses_dq(2, 16, kSmall));
  EXPECT_TRUE(fuses_dq(32, 16, kSmall));
  EXPECT_FALSE(fuses_dq(8, 2, kMaxFusedRowBytes + 1));
  EXPECT_FALSE(fuses_dq(0, 1, kSmall));
  {
    const ScopedEnv on(kFusedBackwardSwitch, "1");
    EXPECT_TRUE(fuses_dq(1, 16, kSmall));
    EXPECT_FALSE(fuses_dq(8, 2, kMaxFusedRowBytes + 1));
  }
  const ScopedEnv off(kFusedBackwardSwitch, "0");
  EXPECT_FALSE(fuses_dq(8, 2, kSmall));
}

// ---- finite differences ------------------------------------------------------------------------

// L(q, k, v) = sum(out * dout), whose gradient is exactly what backward computes for that dout.
double loss(const Problem& p, Tensors t) {
  reference_forward(p, t);
  double sum = 0;
  for (size_t n = 0; n < t.out.size(); ++n) sum += t.out[n] * t.dout[n];
  return sum;
}

// Central differences of the float64 reference's loss at every element of q, k and v.
struct NumericGrad {
  std::vector<double> dq, dk, dv;
};
NumericGrad numeric_gradient(const Problem& p, const Tensors& t) {
  constexpr double kStep = 1e-6;  // central differences in double: error ~ step^2 + eps/step
  NumericGrad g;
  auto diff = [&](std::vector<double> Tensors::*member, std::vector<double>& out) {
    out.resize((t.*member).size());
    for (size_t n = 0; n < out.size(); ++n) {
      Tensors plus = t, minus = t;
      (plus.*member)[n] += kStep;
      (minus.*member)[n] -= kStep;
      out[n] = (loss(p, plus) - loss(p, minus)) / (2 * kStep);
    }
  };
  diff(&Tensors::q, g.dq);
  diff(&Tensors::k, g.dk);
  diff(&Tensors::v, g.dv);
  return g;
}

// A case small enough for differences at every element, with every feature that changes the
// gradient: GQA (dk/dv summed over two heads), causal with Sq > Sk (fully masked rows), a window.
Problem tiny_problem() {
  Problem p = dense(2, 4, 2, 7, 5, 3);
  p.causal = true;
  p.window_left = 2;
  return p;
}

Tensors random_inputs(const Problem& p, std::mt19937_64& rng) {
  Tensors t;
  const int64_t nq = p.total_q() * p.heads_q * p.head_dim, nk = p.total_k() * p.heads_kv * p.head_dim;
  // No rounding: DType::kFloat32 is the widest storage rounding randn offers, and the difference
  // check wants exact doubles, so use the distribution directly.
  std::normal_distribution<double> normal(0.0, 1.0);
  auto draw = [&](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (double& x : v) x = normal(rng);
    return v;
  };
  t.q = draw(nq);
  t.k = draw(nk);
  t.v = draw(nk);
  t.dout = draw(nq);
  return t;
}

TEST(ReferenceBackward, MatchesFiniteDifferences) {
  constexpr double kTolerance = 1e-7;
  for (const Problem& p : {tiny_problem(), packed(2, 1, 4, {3, 0, 5}, {4, 2, 1})}) {
    std::mt19937_64 rng = fresh_rng();
    Tensors t = random_inputs(p, rng);
    const NumericGrad num = numeric_gradient(p, t);
    reference_backward(p, t);
    EXPECT_TRUE(all_close(t.dq, num.dq, kTolerance, kTolerance)) << "dq of " << p.str();
    EXPECT_TRUE(all_close(t.dk, num.dk, kTolerance, kTolerance)) << "dk of " << p.str();
    EXPECT_TRUE(all_close(t.dv, num.dv, kTolerance, kTolerance)) << "dv of " << p.str();
  }
}

TEST(CpuBackward, Fp32MatchesFiniteDifferencesOfTheReferenceForward) {
  // The fp32 backend sees inputs rounded to fp32; differentiate the reference at those values.
  constexpr double kTolerance = 1e-4;
  const Problem p = tiny_problem();
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, DType::kFloat32, Layout::kBSHD, rng);
  run_forward(c);
  run_backward(c);
  const NumericGrad num = numeric_gradient(p, c.values);
  EXPECT_TRUE(all_close(c.dq.to_double(), num.dq, kTolerance, kTolerance)) << "dq";
  EXPECT_TRUE(all_close(c.dk.to_double(), num.dk, kTolerance, kTolerance)) << "dk";
  EXPECT_TRUE(all_close(c.dv.to_double(), num.dv, kTolerance, kTolerance)) << "dv";
}

}  // namespace
}  // namespace fusedattn::testing
