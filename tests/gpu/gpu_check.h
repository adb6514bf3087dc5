// The CUDA backend against the float64 reference through the public API: fresh inputs, outputs
// poisoned on the device, every element compared under the 2x rule.
#pragma once

#include <gtest/gtest.h>

#include "cpu/cpu_check.h"  // dense(), packed(), with_mask(), atol_for(), kLseAtol
#include "gpu/gpu_util.h"

namespace fusedattn::testing {

constexpr DType kGpuDtypes[] = {DType::kFloat16, DType::kBFloat16};

// Checks a forward's results, as downloaded into c.out and c.lse, against the float64 reference
// (the 2x rule), and leaves the reference's out/lse in c.values.
inline void expect_forward_matches_reference(HostCase& c) {
  Tensors ref = c.values, plain = c.values;
  reference_forward(c.problem, ref);
  plain_forward(c.problem, c.dtype, plain);
  EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(c.dtype))) << "out of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse of " << case_name(c);
  c.values.out = ref.out;
  c.values.lse = ref.lse;
}

// Forward on the device; checks out and lse. The returned case holds the results (c.out,
// c.lse) and the reference's out/lse in c.values.
inline SkipReason check_forward_gpu(HostCase& c) {
  DeviceCase dc(c);
  if (SkipReason skip = dc.forward()) return skip;
  expect_forward_matches_reference(c);
  return std::nullopt;
}

inline SkipReason check_forward_gpu(const Problem& p, DType dtype, Layout layout = Layout::kBSHD) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, layout, rng);
  return check_forward_gpu(c);
}

// Forward then backward on the device; checks out, lse, dq, dk, dv.
inline SkipReason check_backward_gpu(HostCase& c, bool deterministic = false) {
  const Problem& p = c.problem;
  DeviceCase dc(c);
  if (SkipReason skip = dc.forward()) return skip;
  if (SkipReason skip = dc.backward(deterministic)) return skip;
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  reference_backward(p, ref);
  plain_forward(p, c.dtype, plain);
  plain_backward(p, c.dtype, plain);
  const double atol = atol_for(c.dtype);
  EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol)) << "out of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), plain.dq, ref.dq, atol)) << "dq of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol)) << "dk of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol)) << "dv of " << case_name(c);
  return std::nullopt;
}

inline SkipReason check_backward_gpu(const Problem& p, DType dtype, Layout layout = Layout::kBSHD) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, layout, rng);
  return check_backward_gpu(c);
}

// Both GPU dtypes; the first missing instance ends the test as skipped.
inline SkipReason forward_all_dtypes(const Problem& p, Layout layout = Layout::kBSHD) {
  for (DType dtype : kGpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
    if (SkipReason skip = check_forward_gpu(p, dtype, layout)) return skip;
  }
  return std::nullopt;
}

inline SkipReason backward_all_dtypes(const Problem& p, Layout layout = Layout::kBSHD) {
  for (DType dtype : kGpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
    if (SkipReason skip = check_backward_gpu(p, dtype, layout)) return skip;
  }
  return std::nullopt;
}

}  // namespace fusedattn::testing
