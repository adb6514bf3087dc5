// The Hopper forward's split last wave (src/cuda/sm90/fwd_split.h, split_combine.cuh): full-mask
// launches with fewer tiles than SMs (one sequence, few heads) run each tile as several KV-block
// parts whose results the last part combines; the last wave's tiles are cut into shares of their
// KV blocks (cuda/common/tail_shares.h), one share per work item, a share crossing a tile's end
// running as one part of each tile it touches. Every shape here is first asserted to split (the
// plan the launch uses, asked through the same host function), so a silently disabled split
// fails the test rather than passing on the unsplit path; then out and LSE against the float64
// reference (2x rule, outputs poisoned before each run, fresh inputs), bit-identical repeats, and
// the switch that turns it off. Skips on devices other than compute capability 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/dispatch.h"
#include "cuda/sm90/fwd_split.h"
#include "fusedattn/params.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"

namespace fusedattn::testing {
namespace {

constexpr int kRepeats = 3;

// The work list the Hopper launch plans for pr; steps == 0 where dispatch does not send pr to
// the Hopper forward (after expect_split, which tells a missing instance from a failure).
cuda::sm90::FwdWork planned_work(const Problem& pr, DType dtype) {
  return planned_sm90_work(pr, dtype).value_or(cuda::sm90::FwdWork{});
}

// Fewer tiles than SMs and enough KV blocks per tile: each must split. Head dims of every
// instance and below one (80, 120: the TMA zero-fills the columns past head_dim), seqlen_k not a
// multiple of any KV block (the last part's last block is cut), Sq != Sk both ways, GQA.
std::vector<Problem> split_shapes() {
  return {dense(1, 2, 2, 1024, 1024, 128), dense(1, 2, 2, 1024, 1100, 64), dense(1, 2, 2, 600, 1500, 256),
          dense(1, 4, 2, 700, 1500, 80),   dense(1, 2, 1, 1000, 1000, 120), dense(1, 2, 2, 300, 2000, 128),
          dense(1, 2, 2, 1500, 900, 128),  dense(1, 3, 1, 500, 1234, 64)};
}

// Asserts the launch will split pr; false where it does not, after a recorded failure, or where
// this build has no Hopper forward for pr's head dim, whose reason goes to `skipped` (the first
// one: the test runs the cases the build has, then skips; expect_sm90_work, sm90_plan.h).
bool expect_split(const Problem& pr, DType dtype, SkipReason& skipped) {
  const auto w = expect_sm90_work(pr, dtype, skipped);
  if (!w) return false;
  EXPECT_TRUE(w->split.split()) << pr.str() << ": " << w->tiles << " tiles of " << w->kv_blocks << " KV blocks";
  EXPECT_LT(w->split.whole, w->tiles) << pr.str();
  return w->split.split();
}

TEST(Sm90TailSplit, SplitShapesMatchReference) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : split_shapes()) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      if (!expect_split(pr, dtype, skipped)) continue;
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// The combine runs in part order whichever part finishes last, so repeats agree to the bit; the
// ticket counters are left at zero by each launch (a stale one would skip or double a combine and
// leave poisoned or wrong rows in a later run).
TEST(Sm90TailSplit, BitIdenticalOverThreeRuns) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : {dense(1, 2, 2, 1024, 1024, 128), dense(1, 4, 2, 700, 1500, 256)}) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      if (!expect_split(pr, dtype, skipped)) continue;
      FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(pr, dtype, kRepeats));
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// Launches of different split counts, parts and head dims in a row on one stream share one
// workspace (grown on demand) and its counters: each must still be right.
TEST(Sm90TailSplit, AlternatingShapesShareTheWorkspace) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  const std::vector<Problem> shapes = {dense(1, 2, 2, 512, 2000, 256), dense(1, 1, 1, 128, 1024, 64),
                                       dense(1, 2, 2, 512, 2000, 256), dense(1, 8, 8, 256, 1024, 128)};
  for (const Problem& pr : shapes) {
    SCOPED_TRACE(pr.str());
    if (!expect_split(pr, DType::kFloat16, skipped)) continue;
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, DType::kFloat16));
  }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// Variable-length batches whose tiles fit one wave (decode and short prompts over long caches)
// split every tile's keys: sequences of 0 and 1 keys (empty parts), keys not a multiple of any
// block, queries crossing a tile's end, GQA packed (decode) and not, every head dim; then
// bit-identical repeats (the combine runs in part order).
std::vector<Problem> varlen_split_shapes(int d) {
  return {packed(8, 2, d, {1, 1, 1, 1, 1}, {3000, 0, 1, 5000, 1777}),
          packed(4, 4, d, {130, 7, 0, 64}, {4100, 2500, 900, 3000}),
          packed(16, 2, d, {4, 3, 5}, {2600, 1, 3900})};
}

TEST(Sm90TailSplit, VarlenFewTilesSplitTheirKeys) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  for (const int d : {64, 128, 256})
    for (const DType dtype : kGpuDtypes)
      for (const Problem& pr : varlen_split_shapes(d)) {
        SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
        if (!expect_split(pr, dtype, skipped)) continue;
        EXPECT_EQ(planned_work(pr, dtype).split.whole, 0);
        FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
      }
  for (const Problem& pr : varlen_split_shapes(128)) {
    SCOPED_TRACE(pr.str());
    if (!expect_split(pr, DType::kBFloat16, skipped)) continue;
    FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(pr, DType::kBFloat16, kRepeats));
  }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// Decode steps on dense caches: a GQA group packed into the tile's rows, so each warpgroup's slice
// holds rows past the sequence's end, which the parts neither write to the workspace nor read
// back. Slices of at most one 8-column chunk per thread are combined spread over the warpgroup and
// written straight to O (split_combine.cuh, spreads), the reads shared out by the rows' holder
// threads: 16 holders for 4 rows at d128 and d256 and 3 queries at head dim 120 (on the d128 tile,
// some holders and groups unused), 32 for 8 rows at d128 and 16 at d64 (exactly one chunk a
// thread), 64 for 32 rows at head dim 32 and 128 for 64 rows at 16 (both on the d64 tile). The
// others by their holders through the epilogue: 20 rows at d64, 24 at d256, and 5 queries at head
// dim 200 (one chunk a thread, but more float4 groups a thread than the d256 tile's registers hold).
// The rows in use must combine right, in both dtypes, and to the bit on repeats.
TEST(Sm90TailSplit, DecodeStepsCombineTheirRowsOnly) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  const std::vector<Problem> shapes = {dense(1, 32, 8, 1, 4096, 128), dense(2, 16, 4, 5, 3000, 64),
                                       dense(1, 8, 1, 3, 2500, 256),  dense(1, 16, 4, 1, 3000, 256),
                                       dense(1, 64, 8, 1, 4096, 128), dense(2, 32, 2, 1, 3000, 64),
                                       dense(1, 1, 1, 3, 3000, 120),  dense(1, 32, 1, 1, 3000, 32),
                                       dense(1, 64, 1, 1, 2000, 16),  dense(1, 1, 1, 5, 3000, 200)};
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : shapes) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      if (!expect_split(pr, dtype, skipped)) continue;
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
    }
  if (expect_split(shapes[0], DType::kFloat16, skipped))
    FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(shapes[0], DType::kFloat16, kRepeats));
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// FUSEDATTN_SM90_FEW_ROWS_PARTS=32 (fwd_split.h, few_rows_parts): decode tiles cut into more than
// kTailMaxParts parts (12 to 29 on 132 SMs), so the spread combine runs several rounds of parts in
// flight at every head dim (8 parts a round for 4 rows at d64 and d128, 4 for 4 rows at d256 and
// for 16 at d64); both dtypes, and to the bit on repeats.
TEST(Sm90TailSplit, DecodeTilesInManyParts) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  const ScopedEnv finer("FUSEDATTN_SM90_FEW_ROWS_PARTS", "32");
  const std::vector<Problem> shapes = {dense(1, 32, 8, 1, 6000, 128), dense(1, 32, 8, 1, 3000, 64),
                                       dense(1, 16, 4, 1, 9000, 256), dense(2, 32, 2, 1, 5000, 64)};
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : shapes) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      if (!expect_split(pr, dtype, skipped)) continue;
      EXPECT_GT(planned_work(pr, dtype).split.max_parts, cuda::kTailMaxParts);
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
    }
  if (expect_split(shapes[0], DType::kFloat16, skipped))
    FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(shapes[0], DType::kFloat16, kRepeats));
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// FUSEDATTN_SM90_TAIL_SPLIT=0: the plan keeps every tile whole and the results still match.
TEST(Sm90TailSplit, SwitchOffRunsUnsplit) {
  SKIP_UNLESS_HOPPER();
  const Problem pr = dense(1, 2, 2, 1024, 1100, 128);
  SkipReason skipped;
  const bool split = expect_split(pr, DType::kFloat16, skipped);
  FUSEDATTN_RUN_OR_SKIP(skipped);
  if (!split) return;
  const ScopedEnv off("FUSEDATTN_SM90_TAIL_SPLIT", "0");
  const cuda::sm90::FwdWork w = planned_work(pr, DType::kFloat16);
  EXPECT_FALSE(w.split.split());
  EXPECT_EQ(w.split.whole, w.tiles);
  for (const DType dtype : kGpuDtypes) FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
}

// Every scheduling switch with a split launch: the static round robin, one CTA per work item,
// one Q buffer, no overlap (the parts' odd and even block counts in the non-overlapped loop).
TEST(Sm90TailSplit, SplitUnderEverySchedule) {
  SKIP_UNLESS_HOPPER();
  const Problem pr = dense(1, 2, 2, 1024, 1100, 128);
  SkipReason skipped;
  const bool split = expect_split(pr, DType::kFloat16, skipped);
  FUSEDATTN_RUN_OR_SKIP(skipped);
  if (!split) return;
  const std::vector<EnvSettings> settings = {
      {{"FUSEDATTN_SM90_DYNAMIC", "0"}},
      {{"FUSEDATTN_SM90_PERSISTENT", "0"}},
      {{"FUSEDATTN_SM90_Q_PREFETCH", "0"}},
      {{"FUSEDATTN_SM90_OVERLAP", "0"}},
      {{"FUSEDATTN_SM90_D64_TILE", "128"}}};
  for (const auto& s : settings) {
    const ScopedEnvs env(s);
    SCOPED_TRACE(std::string(s[0].first) + "=" + s[0].second);
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, DType::kFloat16));
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 700, 1100, 64), DType::kBFloat16));
  }
}

// Shares that cross tiles (FUSEDATTN_SM90_TAIL_SHARES forces the count): a share runs the end of
// one tile and the start of the next, tiles run as 2 to 4 parts of unequal lengths, every head
// dim's instance, a tail after whole tiles (144 tiles on 132 SMs), under both schedules; then
// bit-identical repeats. Each forced cut is first asserted to cross tiles. One test per case, so
// that the GPU suite's shards share them out.
struct CrossingCase {
  Problem pr;
  const char* shares;
};
const std::vector<CrossingCase> kCrossingCases = {
    {dense(1, 2, 2, 1024, 1100, 128), "7"}, {dense(1, 2, 2, 1024, 1100, 128), "23"},
    {dense(1, 2, 2, 1024, 1100, 128), "50"}, {dense(1, 2, 2, 600, 1500, 256), "9"},
    {dense(1, 3, 1, 500, 1234, 64), "5"},    {dense(1, 4, 2, 700, 1500, 192), "11"},
    {dense(1, 4, 2, 700, 1500, 96), "13"},   {dense(2, 9, 9, 1024, 2000, 128), "40"}};
// gtest prints a parameter in test listings and failures.
void PrintTo(const CrossingCase& c, std::ostream* os) { *os << c.pr.str() << " shares " << c.shares; }
class Sm90CrossingShares : public ::testing::TestWithParam<CrossingCase> {};

TEST_P(Sm90CrossingShares, SharesCrossingTilesMatchReference) {
  SKIP_UNLESS_HOPPER();
  const CrossingCase& c = GetParam();
  const ScopedEnv forced("FUSEDATTN_SM90_TAIL_SHARES", c.shares);
  SCOPED_TRACE(c.pr.str() + " shares " + c.shares);
  SkipReason skipped;
  const bool split = expect_split(c.pr, DType::kFloat16, skipped);
  FUSEDATTN_RUN_OR_SKIP(skipped);
  if (!split) return;
  const cuda::TailShares s = planned_work(c.pr, DType::kFloat16).split;
  EXPECT_EQ(s.shares, std::atoi(c.shares));
  bool crosses = false;
  for (int j = 0; j < s.shares; ++j) crosses |= s.share_begin(j) / s.steps != (s.share_begin(j + 1) - 1) / s.steps;
  EXPECT_TRUE(crosses) << "a share runs parts of two tiles";
  for (const DType dtype : kGpuDtypes) FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(c.pr, dtype));
  for (const char* dynamic : {"0", "1"}) {
    const ScopedEnv schedule("FUSEDATTN_SM90_DYNAMIC", dynamic);
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(c.pr, DType::kBFloat16));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90CrossingShares, ::testing::ValuesIn(kCrossingCases),
                         [](const ::testing::TestParamInfo<CrossingCase>& info) {
                           return "d" + std::to_string(info.param.pr.head_dim) + "_B" +
                                  std::to_string(info.param.pr.batch) + "_shares" + info.param.shares;
                         });

TEST(Sm90TailSplit, SharesCrossingTilesRepeatBitIdentical) {
  SKIP_UNLESS_HOPPER();
  const ScopedEnv forced("FUSEDATTN_SM90_TAIL_SHARES", "23");
  FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(dense(1, 2, 2, 1024, 1100, 128), DType::kFloat16, kRepeats));
}

}  // namespace
}  // namespace fusedattn::testing
