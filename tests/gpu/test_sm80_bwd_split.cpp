// The sm80 backward's tail split (src/cuda/sm80/bwd_split.h) on small full-mask launches, whose
// N items (KV blocks x KV heads x batch) are fewer than the GPU's SMs, so every item is cut into
// parts. Each case asserts three things: the plan splits the shape; the kernel really ran split
// (the workspace's per-item part counters, poisoned before the call, read `parts` after it: the
// last part's ticket); and dQ/dK/dV obey the 2x rule against the float64 reference. With
// FUSEDATTN_BWD_TAIL_SPLIT=0 the counters stay untouched and the gradients stay right.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/dispatch.h"
#include "cuda/sm80/bwd_split.h"
#include "cuda/sm80/bwd_workspace.h"
#include "fusedattn/attention.h"
#include "gpu/gpu_util.h"
#include "gpu/scoped_env.h"
#include "reference/problems.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

// The backward tiles of bwd_tile.h for head dims up to 128 (Hopper rows and A100 rows alike):
// 128 key rows per CTA; 128 query rows per iteration up to d64, 64 above. bwd_tile.h itself is
// device code; if these drift from it, the counter check below fails.
constexpr int kBlockN = 128;
constexpr int kSmallHeadBlockM = 128;
constexpr int kLargeHeadBlockM = 64;
constexpr int kSmallHeadMaxDim = 64;

int block_m_of(int head_dim) { return head_dim <= kSmallHeadMaxDim ? kSmallHeadBlockM : kLargeHeadBlockM; }

// A device buffer of `bytes`, freed at scope exit (the workspace, poisoned by the test itself).
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t bytes) { cuda_check(cudaMalloc(&data, bytes > 0 ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data = nullptr;
};

// What bwd_split.h and bwd_workspace.h read of the backend's parameters, for a dense problem.
BwdParams params_of(const Problem& problem) {
  BwdParams p;
  set_shape(p, problem);
  return p;
}

// Hopper runs the large-memory rows (unless FUSEDATTN_BWD_SM80_TILE=1).
constexpr int kLargeTileMajor = 9;
bool large_tiles_run() {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major >= kLargeTileMajor;
}

// The kernel row a case runs on: its instance's head dim and whether the tile is the large one.
struct Row {
  int instance_dim;
  bool large;
};

// One backward call on the GPU with its own poisoned workspace; checks the gradients and the
// part counters: split_expected says the launch on `row` must split (the plan and the row
// agree), otherwise it must run every item whole.
void check_split_backward(const Problem& problem, DType dtype, Row row, bool split_expected) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (row.large && !large_tiles_run()) GTEST_SKIP() << "the large-memory rows run on Hopper";
  SCOPED_TRACE(problem.str() + " " + dtype_name(dtype) + (split_expected ? " split" : " unsplit"));

  const BwdParams bp = params_of(problem);
  // A build without the row's head dim (GPU_HEAD_DIMS) runs the problem on a larger instance,
  // whose row the case does not describe.
  BwdParams dispatched = bp;
  dispatched.dtype = dtype;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  try {
    if (cuda::choose_backward(dispatched, major, minor).instance_head_dim != row.instance_dim)
      GTEST_SKIP() << "this build has no d" << row.instance_dim << " backward instance";
  } catch (const Error&) {
    GTEST_SKIP() << "this build has no backward instance for the case";
  }
  const cuda::sm80::BwdLaunchShape shape = cuda::sm80::bwd_launch_shape(bp, block_m_of(problem.head_dim), kBlockN);
  const cuda::TailSplit plan = cuda::sm80::bwd_tail_split(bp, shape, sm_count());
  ASSERT_LT(shape.items, sm_count()) << "the case must leave SMs idle unsplit";
  if (split_expected) {
    ASSERT_TRUE(cuda::sm80::bwd_row_splits(row.instance_dim, row.large)) << "the kernel row never splits";
    ASSERT_GE(plan.parts, 2) << "the plan does not split this shape";
    ASSERT_EQ(plan.whole, 0) << "a launch below one wave splits every item";
  }

  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(problem, dtype, Layout::kBSHD, rng);
  Tensors ref = c.values;
  reference_forward(problem, ref);
  c.out.fill(ref.out);
  c.lse.fill(ref.lse);
  reference_backward(problem, ref);
  Tensors plain = c.values;
  plain_backward(problem, dtype, plain);

  DeviceCase dc(c);
  BackwardArgs a = dc.backward_args();
  a.workspace_bytes = backward_workspace_bytes(a);
  DeviceBuffer workspace(a.workspace_bytes);
  a.workspace = workspace.data;
  cuda_check(cudaMemset(workspace.data, kPoisonByte, a.workspace_bytes), "poison the workspace");
  const SkipReason missing = dc.backward(a);
  ASSERT_FALSE(missing) << *missing;
  const double atol = atol_for(dtype);
  EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), plain.dq, ref.dq, atol)) << "dq";
  EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol)) << "dk";
  EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol)) << "dv";

  // Every part of a split item takes one ticket; unsplit launches never touch the counters.
  const cuda::sm80::BwdWorkspaceLayout layout = cuda::sm80::bwd_workspace_layout(bp);
  if (!split_expected && !cuda::sm80::bwd_may_split(bp)) {
    EXPECT_EQ(layout.split_items, 0) << "a call that never splits gets no slots";
    return;
  }
  ASSERT_GE(layout.split_items, shape.items) << "the workspace holds no slots for this launch";
  std::vector<int32_t> counts(static_cast<std::size_t>(shape.items));
  cuda_check(cudaMemcpy(counts.data(), static_cast<unsigned char*>(workspace.data) + layout.split_count,
                        counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
             "part counters");
  const int32_t untouched = -1;  // four poison bytes
  for (std::size_t i = 0; i < counts.size(); ++i)
    EXPECT_EQ(counts[i], split_expected ? plan.parts : untouched) << "part counter of item " << i;
}

// The split is the portable kernels' (their d64/d128 calls on Hopper take the Hopper backward
// otherwise).
class Sm80BackwardSplit : public ::testing::TestWithParam<DType> {
  const ScopedEnv portable_{"FUSEDATTN_SM90_BWD", "0"};
};

// The d64 Hopper row (the only row that splits, bwd_row_splits): query blocks cut by the
// sequence end, Sq != Sk.
TEST_P(Sm80BackwardSplit, Head64RaggedQueries) {
  check_split_backward(dense(1, 2, 2, 1000, 1100, 64), GetParam(), {64, true}, true);
}
// GQA group 2: a part's iterations cross from one query head to the next.
TEST_P(Sm80BackwardSplit, Head64GroupedQueries) {
  check_split_backward(dense(1, 4, 2, 1000, 900, 64), GetParam(), {64, true}, true);
}
// Rows that do not split run every item whole on the split-sized workspace: the d128 Hopper row,
// head dim 72 on the d96 instance, the A100 rows (d64 and d128).
TEST_P(Sm80BackwardSplit, OtherRowsRunWhole) {
  check_split_backward(dense(1, 2, 2, 1000, 1100, 128), GetParam(), {128, true}, false);
  check_split_backward(dense(1, 4, 2, 1000, 900, 128), GetParam(), {128, true}, false);
  check_split_backward(dense(1, 4, 2, 700, 1024, 72), GetParam(), {96, false}, false);
  const ScopedEnv sm80_tiles("FUSEDATTN_BWD_SM80_TILE", "1");
  check_split_backward(dense(1, 4, 2, 1000, 900, 64), GetParam(), {64, false}, false);
  check_split_backward(dense(1, 4, 2, 1000, 900, 128), GetParam(), {128, false}, false);
}
// The A/B switch: every item whole, the same gradients.
TEST_P(Sm80BackwardSplit, SwitchOffRunsWhole) {
  const ScopedEnv no_split("FUSEDATTN_BWD_TAIL_SPLIT", "0");
  check_split_backward(dense(1, 2, 2, 1000, 1100, 64), GetParam(), {64, true}, false);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Sm80BackwardSplit, ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace fusedattn::testing
