// Checks of the CPU backend against the float64 reference: one call runs a problem through the
// public API and compares every output element. fp32 must match tightly; fp16/bf16 obey the 2x
// rule against the plain same-dtype implementation.
#pragma once

#include <gtest/gtest.h>

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

}  // namespace fusedattn::testing
