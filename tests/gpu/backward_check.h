// The CUDA backward through the public API against the float64 reference, shared by the suites
// of its kernels (test_sm80_bwd.cpp, test_sm90_bwd.cpp): every gradient obeys the 2x rule, and
// deterministic mode is bit-identical run to run. Out and lse come from the reference forward, so
// these checks judge the backward alone.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "gpu/gpu_util.h"
#include "gpu/missing_instance.h"
#include "reference/problems.h"
#include "reference/test_util.h"

namespace fusedattn::testing {

constexpr int kDeterminismRuns = 3;

struct GpuCase {
  Problem problem;
  DType dtype = DType::kFloat16;
  Layout layout = Layout::kBSHD;
  bool deterministic = false;
  double query_gain = 1.0;  // scales q to test large logits
};

inline std::string name_of(const GpuCase& c) {
  return c.problem.str() + " " + dtype_name(c.dtype) + (c.layout == Layout::kBHSD ? " BHSD" : " BSHD") +
         (c.deterministic ? " deterministic" : "");
}

inline void check_backward(const GpuCase& gc) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE(name_of(gc));
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(gc.problem, gc.dtype, gc.layout, rng);
  if (gc.query_gain != 1.0) {
    for (double& x : c.values.q) x = round_to(gc.dtype, x * gc.query_gain);
    refill_inputs(c);
  }
  Tensors ref = c.values;
  reference_forward(gc.problem, ref);
  c.out.fill(ref.out);
  c.lse.fill(ref.lse);
  reference_backward(gc.problem, ref);
  Tensors plain = c.values;
  plain_backward(gc.problem, gc.dtype, plain);

  // The device copies (gpu_util.h), out and lse the reference's; each run poisons the device
  // gradients, runs the backward and downloads them into c.dq/dk/dv.
  DeviceCase dc(c);
  BackwardArgs a = dc.backward_args();
  a.deterministic = gc.deterministic;

  std::vector<unsigned char> first[3];
  const HostTensor* grads[3] = {&c.dq, &c.dk, &c.dv};
  const int runs = gc.deterministic ? kDeterminismRuns : 1;
  for (int run = 0; run < runs; ++run) {
    // A build without this head dim's instance (GPU_HEAD_DIMS) skips, as the other suites do.
    FUSEDATTN_RUN_OR_SKIP(dc.backward(a));
    if (run == 0) {
      // Only dk grows with the query gain (dk = scale dS^T q; dq = scale dS k, dv = P^T dO), so
      // only its slack does (as GpuEdges.LargeLogitsStayFiniteAndCorrect).
      const double atol = atol_for(gc.dtype);
      EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), plain.dq, ref.dq, atol)) << "dq";
      EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol * gc.query_gain)) << "dk";
      EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol)) << "dv";
      for (int i = 0; i < 3; ++i) {
        const auto* bytes = static_cast<const unsigned char*>(grads[i]->data());
        first[i].assign(bytes, bytes + grads[i]->nbytes());
      }
    } else {
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(std::memcmp(first[i].data(), grads[i]->data(), first[i].size()), 0)
            << "gradient " << i << " (dq, dk, dv) differs on run " << run;
    }
  }
}

inline Problem causal(Problem p) {
  p.causal = true;
  return p;
}
inline Problem window(Problem p, int64_t left, int64_t right) {
  p.window_left = left, p.window_right = right;
  return p;
}
inline Problem varlen(Problem p, std::vector<int64_t> lens_q, std::vector<int64_t> lens_k) {
  p.batch = static_cast<int>(lens_q.size());
  p.lens_q = std::move(lens_q);
  p.lens_k = std::move(lens_k);
  return p;
}

}  // namespace fusedattn::testing
