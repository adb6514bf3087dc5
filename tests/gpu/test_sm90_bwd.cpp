// The Hopper backward (src/cuda/sm90/bwd_kernel.cuh) through the public API against the float64
// reference (gpu/backward_check.h), and which calls dispatch sends to it. Every case asserts
// first that it runs on the Hopper kernel, so a dispatch change cannot move it unnoticed onto the
// portable one; on other GPUs and in builds without the Hopper instances the cases skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/dispatch.h"
#include "gpu/backward_check.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"

namespace fusedattn::testing {
namespace {

// The params dispatch sees for a backward of pr.
BwdParams backward_planning_params(const Problem& pr, DType dtype, bool deterministic = false) {
  BwdParams p;
  static_cast<FwdParams&>(p) = planning_params(pr, dtype);
  p.deterministic = deterministic;
  return p;
}

// The kernel dispatch picks for a backward of pr on an sm_90 device (arch "" when this build has
// no instance for it).
cuda::BwdChoice backward_choice(const Problem& pr, DType dtype, bool deterministic = false) {
  try {
    return cuda::choose_backward(backward_planning_params(pr, dtype, deterministic), 9, 0);
  } catch (const Error&) {
    return {};
  }
}
std::string backward_arch(const Problem& pr, DType dtype, bool deterministic = false) {
  return backward_choice(pr, dtype, deterministic).arch;
}

// The Hopper backward's tiles: each case runs at every instance head dim.
constexpr int kHopperBackwardHeadDims[] = {64, 128, 256};

// check_backward on the Hopper kernel: skips where it cannot run, fails where dispatch would not
// pick it.
void check_hopper_backward(const GpuCase& gc) {
  if (!cuda_available() || !on_hopper()) GTEST_SKIP() << "the Hopper backward runs on sm_90 devices";
  const std::string arch = backward_arch(gc.problem, gc.dtype, gc.deterministic);
  if (arch.empty()) GTEST_SKIP() << "this build has no instance for " << name_of(gc);
  if (arch != "sm90") {
    // A build without the Hopper kernels (FUSEDATTN_SM90=OFF, or this head dim's left out).
    const Problem probe = dense(1, 1, 1, 64, 64, gc.problem.head_dim);
    if (backward_arch(probe, gc.dtype) != "sm90") GTEST_SKIP() << "this build has no Hopper backward instance for " << name_of(gc);
    FAIL() << name_of(gc) << " dispatches to " << arch << ", not to the Hopper backward";
  }
  check_backward(gc);
}

struct HopperBackwardParam {
  DType dtype;
  int head_dim;  // an instance's
};
void PrintTo(const HopperBackwardParam& param, std::ostream* os) {
  *os << dtype_name(param.dtype) << " d" << param.head_dim;
}

class Sm90Backward : public ::testing::TestWithParam<HopperBackwardParam> {
 protected:
  DType dtype() const { return GetParam().dtype; }
  int d() const { return GetParam().head_dim; }
};

// One KV block and one query block; several of each with partial last ones (77 x 133: two or
// three KV blocks of 128 or 64 keys, one query block of 128 or two of 64); many query blocks per
// CTA (the ring of Q and dO stages wraps); the BHSD layout.
TEST_P(Sm90Backward, RaggedLengths) {
  check_hopper_backward({dense(1, 2, 2, 50, 60, d()), dtype()});
  check_hopper_backward({dense(2, 4, 4, 77, 133, d()), dtype()});
  check_hopper_backward({dense(1, 2, 1, 600, 300, d()), dtype()});
  check_hopper_backward({dense(1, 2, 2, 130, 260, d()), dtype(), Layout::kBHSD});
}
TEST_P(Sm90Backward, CausalMoreQueriesThanKeys) {
  check_hopper_backward({causal(dense(1, 2, 2, 200, 130, d())), dtype()});  // leading rows see no key
  check_hopper_backward({causal(dense(1, 2, 2, 300, 70, d())), dtype()});
}
TEST_P(Sm90Backward, CausalMoreKeysThanQueries) {
  check_hopper_backward({causal(dense(2, 2, 2, 130, 400, d())), dtype()});
  check_hopper_backward({causal(dense(1, 2, 2, 130, 300, d())), dtype(), Layout::kBHSD});
}
TEST_P(Sm90Backward, SlidingWindow) {
  check_hopper_backward({window(dense(1, 2, 1, 257, 300, d()), 40, 10), dtype()});
  check_hopper_backward({window(dense(1, 2, 2, 400, 400, d()), 100, 0), dtype()});
  check_hopper_backward({window(dense(1, 2, 2, 300, 5, d()), 3, 0), dtype()});  // a narrow window, few keys
}
TEST_P(Sm90Backward, GroupedAndMultiQuery) {
  check_hopper_backward({causal(dense(2, 6, 2, 150, 150, d())), dtype()});
  check_hopper_backward({dense(1, 3, 1, 1, 400, d()), dtype()});
  check_hopper_backward({dense(1, 8, 1, 200, 260, d()), dtype()});
}
TEST_P(Sm90Backward, VarlenCausalWithEmptySequences) {
  check_hopper_backward({varlen(causal(dense(0, 2, 2, 0, 0, d())), {17, 0, 170, 64}, {40, 33, 200, 0}), dtype()});
  check_hopper_backward({varlen(window(dense(0, 4, 2, 0, 0, d()), 30, 7), {70, 129, 1}, {100, 64, 9}), dtype()});
}
// Head dims below the instance: the loads zero-fill the columns past them, the dQ adds and the
// dK/dV stores leave them out, and the dQ rows are head_dim (rounded up to 8) floats apart.
TEST_P(Sm90Backward, HeadDimsBelowInstance) {
  check_hopper_backward({dense(1, 2, 1, 97, 260, d() - 24), dtype(), Layout::kBHSD});
  check_hopper_backward({causal(dense(1, 2, 2, 130, 150, d() - 8)), dtype()});
}
TEST_P(Sm90Backward, LargeLogits) {
  check_hopper_backward({dense(1, 2, 2, 200, 200, d()), dtype(), Layout::kBSHD, false, 100.0});
  check_hopper_backward({causal(dense(1, 2, 2, 200, 200, d())), dtype(), Layout::kBSHD, false, 100.0});
}
// Q, dO, K and V maps with 128-byte L2 promotion (bwd_launch.cuh, bwd_l2_promotion): what the
// TMA loads is the same, so the results must be.
TEST_P(Sm90Backward, L2PromotionSwitchStaysCorrect) {
  const ScopedEnv narrow("FUSEDATTN_SM90_BWD_L2_128B", "1");
  check_hopper_backward({dense(2, 4, 2, 330, 450, d()), dtype()});
  check_hopper_backward({causal(dense(1, 2, 2, 130, 300, d())), dtype(), Layout::kBHSD});
}
// Deterministic calls: the writer warp adds each query block's dQ in ascending KV block order
// (d256's from the stage), so repeated runs are bit-identical (check_backward runs them twice
// and compares); several KV blocks meet in each query block, with GQA, a window, a varlen batch.
TEST_P(Sm90Backward, DeterministicRunsAreBitIdentical) {
  check_hopper_backward({causal(dense(1, 4, 2, 300, 700, d())), dtype(), Layout::kBSHD, true});
  check_hopper_backward({dense(2, 2, 2, 200, 530, d()), dtype(), Layout::kBHSD, true});
  check_hopper_backward({varlen(window(dense(0, 4, 2, 0, 0, d()), 90, 7), {170, 329, 1}, {400, 264, 9}), dtype(),
                         Layout::kBSHD, true});
}
// Small shapes for compute-sanitizer (tools/gpu_check.sh runs tests matching *Sanitizer*): ragged
// lengths, a window, a varlen batch with an empty sequence.
TEST_P(Sm90Backward, SanitizerSmallRagged) {
  check_hopper_backward({causal(dense(2, 2, 1, 77, 133, d())), dtype()});
  check_hopper_backward({window(dense(1, 2, 1, 70, 190, d()), 20, 5), dtype()});
  check_hopper_backward({varlen(causal(dense(0, 2, 2, 0, 0, d())), {17, 0, 70}, {40, 33, 20}), dtype()});
}

std::vector<HopperBackwardParam> hopper_backward_params() {
  std::vector<HopperBackwardParam> params;
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const int d : kHopperBackwardHeadDims) params.push_back({dtype, d});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Sm90Backward, ::testing::ValuesIn(hopper_backward_params()), [](const auto& info) {
  return std::string(dtype_name(info.param.dtype)) + "_d" + std::to_string(info.param.head_dim);
});

// What dispatch sends to the Hopper backward on an sm_90 device, and what it leaves portable.
TEST(Sm90BackwardDispatch, HopperWhereItHasATile) {
  const Problem full = dense(1, 2, 2, 256, 256, 128), masked = causal(dense(1, 2, 2, 256, 256, 128));
  if (backward_arch(full, DType::kFloat16) != "sm90") GTEST_SKIP() << "this build has no Hopper backward";
  EXPECT_EQ(backward_arch(masked, DType::kBFloat16), "sm90");
  EXPECT_EQ(backward_arch(dense(1, 2, 2, 256, 256, 104), DType::kFloat16), "sm90");
  // Deterministic calls run there too: every tile's writer warp adds dQ in ordered turns.
  EXPECT_EQ(backward_arch(full, DType::kFloat16, true), "sm90");
  EXPECT_EQ(backward_arch(masked, DType::kBFloat16, true), "sm90");
  if (const Problem wide = dense(1, 2, 2, 256, 256, 256); backward_arch(wide, DType::kFloat16) == "sm90") {
    EXPECT_EQ(backward_arch(wide, DType::kFloat16, true), "sm90");
  }
  // Its TMA maps need rows in use: a variable-length batch without keys (or without queries)
  // stays portable.
  EXPECT_EQ(backward_arch(varlen(dense(0, 2, 2, 0, 0, 128), {5, 3}, {0, 0}), DType::kFloat16), "sm80");
  EXPECT_EQ(backward_arch(varlen(dense(0, 2, 2, 0, 0, 128), {0, 0}, {7, 9}), DType::kFloat16), "sm80");
  EXPECT_EQ(backward_arch(varlen(dense(0, 2, 2, 0, 0, 128), {5, 3}, {7, 9}), DType::kFloat16), "sm90");
  // Any other head dim runs on a Hopper tile only where the portable kernels would run the same
  // instance (d72 and d96 on d128 in a build without d96, d32 on d64 in one without d32), never
  // padded onto a larger one.
  for (int d : {32, 40, 64, 72, 96, 192, 224, 256}) {
    const Problem pr = dense(1, 2, 2, 256, 256, d);
    cuda::BwdChoice portable;
    {
      const ScopedEnv off("FUSEDATTN_SM90_BWD", "0");
      try {
        portable = cuda::choose_backward(backward_planning_params(pr, DType::kFloat16), 9, 0);
      } catch (const Error&) {
        continue;  // no instance in this build
      }
    }
    const bool hopper_tile = std::find(std::begin(kHopperBackwardHeadDims), std::end(kHopperBackwardHeadDims),
                                       portable.instance_head_dim) != std::end(kHopperBackwardHeadDims);
    const std::string arch = backward_arch(pr, DType::kFloat16);
    if (hopper_tile && arch == "sm80" && backward_arch(dense(1, 2, 2, 256, 256, portable.instance_head_dim),
                                                       DType::kFloat16) != "sm90")
      continue;  // this build left that Hopper instance out
    EXPECT_EQ(arch, hopper_tile ? "sm90" : "sm80") << "d" << d;
  }
  const ScopedEnv off("FUSEDATTN_SM90_BWD", "0");
  EXPECT_EQ(backward_arch(full, DType::kFloat16), "sm80");
}

}  // namespace
}  // namespace fusedattn::testing
