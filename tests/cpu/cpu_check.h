// Checks of the CPU backend against the float64 reference: one call runs a problem through the
// public API and compares every output element. fp32 must match tightly; fp16/bf16 obey the 2x
// rule against the plain same-dtype implementation.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cpu/backward_plan.h"  // kFusedBackwardSwitch
#include "gpu/scoped_env.h"
#include "reference/problems.h"  // dense(), packed(), with_mask()
#include "reference/test_util.h"

namespace fusedattn::testing {

// Every dtype the CPU backend serves; the CPU accuracy tests run each of them.
constexpr DType kCpuDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// fp32: the backend accumulates in fp32 like the reference's rounding of its inputs, so only
// accumulation-order error remains (a few ulps of fp32 times sqrt(seqlen)).
constexpr double kFp32OutAtol = 2e-5, kFp32OutRtol = 1e-5;
constexpr double kFp32LseAtol = 2e-5, kFp32LseRtol = 1e-6;
constexpr double kFp32GradAtol = 1e-4, kFp32GradRtol = 1e-4;
// fp16/bf16: the 2x rule's absolute slack is test_util.h's atol_for.
// lse is fp32 on every dtype, computed from scores of rounded inputs.
constexpr double kLseAtol = 1e-4;

inline std::string case_name(const HostCase& c) {
  return c.problem.str() + " " + dtype_name(c.dtype) + (c.layout == Layout::kBHSD ? " BHSD" : " BSHD");
}

inline void run_forward(HostCase& c) {
  c.out.poison();
  c.lse.poison();
  forward(forward_args(c));
}

// Runs backward call `a`, whose gradients are c's dq, dk and dv, under each of the backward's plans
// (src/cpu/backward_plan.h: two passes, then fused), outputs poisoned before each; the plans must
// agree to the bit. The fused plan's gradients are left in c.
inline void run_backward_both_plans(const BackwardArgs& a, HostCase& c) {
  const auto run_plan = [&](const char* fused) {
    const ScopedEnv plan(cpu::FUSEDATTN_CPU_ISA::kFusedBackwardSwitch, fused);
    c.dq.poison();
    c.dk.poison();
    c.dv.poison();
    backward(a);
    return std::vector<std::vector<unsigned char>>{bytes_of(c.dq), bytes_of(c.dk), bytes_of(c.dv)};
  };
  const auto two_pass = run_plan("0");
  const auto fused = run_plan("1");
  for (size_t n = 0; n < fused.size(); ++n)
    EXPECT_EQ(fused[n], two_pass[n]) << "gradient " << n << " (dq, dk, dv) differs between the backward's plans";
}

// The backward of c's forward, under both plans (its fused plan's gradients left in c).
inline void run_backward(HostCase& c, bool deterministic = false) {
  BackwardArgs a = backward_args(c);
  a.deterministic = deterministic;
  run_backward_both_plans(a, c);
}

// Compares a computed output with the reference, by the fp32 tolerance or the 2x rule.
inline void expect_matches(const char* what, DType dtype, const std::vector<double>& got,
                           const std::vector<double>& ref, const std::vector<double>& plain, double fp32_atol,
                           double fp32_rtol, double low_atol, const std::string& name) {
  if (dtype == DType::kFloat32)
    EXPECT_TRUE(all_close(got, ref, fp32_atol, fp32_rtol)) << what << " of " << name;
  else
    EXPECT_TRUE(obeys_2x_rule(got, plain, ref, low_atol)) << what << " of " << name;
}

// Runs the forward on fresh inputs and checks out and lse against the reference.
inline HostCase check_forward(const Problem& p, DType dtype, Layout layout = Layout::kBSHD,
                              double stddev = kDefaultStddev) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, layout, rng, stddev);
  run_forward(c);
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  if (dtype != DType::kFloat32) plain_forward(p, dtype, plain);
  const std::string name = case_name(c);
  expect_matches("out", dtype, c.out.to_double(), ref.out, plain.out, kFp32OutAtol, kFp32OutRtol, atol_for(dtype), name);
  expect_matches("lse", dtype, c.lse.to_double(), ref.lse, plain.lse, kFp32LseAtol, kFp32LseRtol, kLseAtol, name);
  c.values.out = ref.out;
  c.values.lse = ref.lse;
  return c;
}

// Forward then backward on fresh inputs (under both plans of the backward); checks dq, dk, dv
// against the reference. Returns the case (backend outputs in its tensors, reference out/lse in
// c.values) for further checks.
inline HostCase check_backward(const Problem& p, DType dtype, Layout layout = Layout::kBSHD,
                           double stddev = kDefaultStddev) {
  HostCase c = check_forward(p, dtype, layout, stddev);
  run_backward(c);
  Tensors ref = c.values, plain = c.values;
  reference_backward(p, ref);
  if (dtype != DType::kFloat32) plain_backward(p, dtype, plain);
  const std::string name = case_name(c);
  const double low = atol_for(dtype);
  expect_matches("dq", dtype, c.dq.to_double(), ref.dq, plain.dq, kFp32GradAtol, kFp32GradRtol, low, name);
  expect_matches("dk", dtype, c.dk.to_double(), ref.dk, plain.dk, kFp32GradAtol, kFp32GradRtol, low, name);
  expect_matches("dv", dtype, c.dv.to_double(), ref.dv, plain.dv, kFp32GradAtol, kFp32GradRtol, low, name);
  return c;
}

// The relative rounding step of a storage dtype (2^-mantissa bits).
inline double dtype_epsilon(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return std::ldexp(1.0, -10);
    case DType::kBFloat16: return std::ldexp(1.0, -7);
    default: return std::ldexp(1.0, -23);
  }
}

// Results at large logits (queries scaled up a hundredfold), on the CPU and GPU suites alike.
//
// fp32: the FA2 formulation evaluates exp2(s * scale_log2 - lse_log2) with both
// terms near |s| ~ 150 and recomputes P in the backward from the stored lse, so each exponent
// carries a few fp32 ulps of 150 (~1e-5) where a plain softmax carries one ulp of (s - max).
// That is the algorithm's precision, not a defect: judge fp32 by relative L2 error instead.
constexpr double kFp32LargeLogitsRelL2 = 2e-4;
// fp16/bf16: the plain implementation rounds S (~400 here) to the dtype, so its error, and the 2x
// rule's bound with it, is about as large as the results (a zeroed dq passed it in bf16). Our
// kernels keep S in fp32, so the results must also lie within a few of the dtype's rounding steps
// in relative L2 (at most 3.4 measured, bf16 dq, over 8 seeds) beyond twice the error of the
// algorithm's own float64 model (reference_backward_over_stored_out). That error is the stored
// output's rounding carried into delta: an absolute floor under dq and dk, since with every row's
// softmax nearly one-hot their terms cancel. It is what decides where dq itself is small (a Python
// seed's bf16 dq of L2 norm 0.06 over a floor of 0.037; relative to dq alone, 74 steps).
constexpr double kHalfLargeLogitsRelSteps = 8.0;

// `model`: the float64 model of what FlashAttention computes (for out, lse and dv, the reference).
inline ::testing::AssertionResult large_logits_ok(DType dtype, const std::vector<double>& got,
                                                  const std::vector<double>& plain, const std::vector<double>& ref,
                                                  const std::vector<double>& model, double atol) {
  if (dtype != DType::kFloat32) {
    ::testing::AssertionResult two_x = obeys_2x_rule(got, plain, ref, atol);
    if (!two_x) return two_x;
  }
  const double steps = dtype == DType::kFloat32 ? kFp32LargeLogitsRelL2 : kHalfLargeLogitsRelSteps * dtype_epsilon(dtype);
  const double floor = compare(model, ref).rel_l2;
  const double bound = steps + 2 * floor;
  const ErrorStats e = compare(got, ref);
  if (e.mismatched_nonfinite == 0 && e.rel_l2 <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "rel_l2 " << e.rel_l2 << " (bound " << bound << ": the model's " << floor
                                       << "), max_abs " << e.max_abs << ", non-finite mismatches "
                                       << e.mismatched_nonfinite;
}

// c's forward and backward results (run) at queries scaled by query_gain: the output finite, the
// lse finite exactly where the reference's is, and each result by large_logits_ok.
inline void expect_large_logits_results(const Problem& p, const HostCase& c, double query_gain) {
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  reference_backward(p, ref);
  if (c.dtype != DType::kFloat32) {
    plain_forward(p, c.dtype, plain);
    plain_backward(p, c.dtype, plain);
  }
  const auto out = c.out.to_double(), lse = c.lse.to_double();
  for (double x : out) ASSERT_TRUE(std::isfinite(x));
  for (size_t n = 0; n < lse.size(); ++n) ASSERT_EQ(std::isfinite(lse[n]), std::isfinite(ref.lse[n]));
  Tensors model = c.values;
  reference_backward_over_stored_out(p, model, out);
  const double atol = atol_for(c.dtype);
  EXPECT_TRUE(large_logits_ok(c.dtype, out, plain.out, ref.out, ref.out, atol)) << "out";
  EXPECT_TRUE(large_logits_ok(c.dtype, lse, plain.lse, ref.lse, ref.lse, kLseAtol)) << "lse";
  EXPECT_TRUE(large_logits_ok(c.dtype, c.dq.to_double(), plain.dq, ref.dq, model.dq, atol)) << "dq";
  // dk = scale dS^T q carries the query's gain.
  EXPECT_TRUE(large_logits_ok(c.dtype, c.dk.to_double(), plain.dk, ref.dk, model.dk, atol * query_gain)) << "dk";
  EXPECT_TRUE(large_logits_ok(c.dtype, c.dv.to_double(), plain.dv, ref.dv, ref.dv, atol)) << "dv";
}

}  // namespace fusedattn::testing
