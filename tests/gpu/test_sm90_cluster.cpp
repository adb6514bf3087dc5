// The Hopper forward's CTA pairs (src/cuda/sm90/tile_config.h, kPairCluster; fwd_split.h,
// uses_pair_cluster): two CTAs of a cluster on adjacent query blocks of one (head, batch), each
// loading half the rows of every K/V block and multicasting them into both. Every shape is first
// asserted to run paired (the plan the launch uses, asked through the same host function), so a
// silently unpaired launch fails the test rather than passing on the other path; then out and LSE
// against the float64 reference (2x rule, outputs poisoned before each run, fresh inputs), and
// against the unpaired kernel on the same inputs, to the bit: the pair changes where K/V come
// from, not the arithmetic. Skips on devices other than compute capability 9.0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fusedattn/params.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"

namespace fusedattn::testing {
namespace {

enum class Split { kAny, kNone, kShares };

// Asserts the launch runs pr in clusters of two, its last pairs cut into shares or not as `split`
// says; false where it does not, after a recorded failure (also where dispatch sends pr off the
// Hopper forward), or where this build has no Hopper forward for pr's head dim, whose reason goes
// to `skipped` (the first one: the test runs the cases the build has, then skips;
// expect_sm90_work, sm90_plan.h).
bool expect_paired(const Problem& pr, DType dtype, SkipReason& skipped, Split split = Split::kAny) {
  const auto w = expect_sm90_work(pr, dtype, skipped);
  if (!w) return false;
  EXPECT_EQ(w->shape.cluster_ctas, 2) << pr.str();
  if (split != Split::kAny) {
    EXPECT_EQ(w->split.split(), split == Split::kShares) << pr.str();
  }
  return w->shape.cluster_ctas == 2;
}

// Both paired head dims and d256's two block widths (64 keys up to 4096, 80 beyond); an odd
// number of query blocks (the last pair's second CTA passes its tile through); keys not a multiple
// of the block, and fewer than half a block (the second CTA's share of every block lies past the
// keys: zero-filled, still counted); Sq != Sk both ways; GQA packed into the tiles; more pairs than
// clusters fit at once (the round robin's second pass), at d256 with an even number of KV blocks
// per tile, so that consecutive tiles of a CTA stage O in the same K/V stage. Split or not as the
// plan says (below for forced shares).
std::vector<Problem> paired_shapes() {
  return {dense(2, 4, 4, 1024, 1024, 128), dense(1, 3, 3, 300, 777, 128), dense(1, 8, 2, 200, 600, 128),
          dense(2, 2, 2, 640, 2100, 256),  dense(1, 2, 2, 512, 5000, 256), dense(1, 2, 2, 256, 30, 256),
          dense(1, 2, 1, 900, 333, 256),   dense(2, 40, 40, 256, 128, 128), dense(1, 68, 68, 256, 128, 256)};
}

// d256 stages O in the last K/V stage by default at these lengths (each CTA's producer then waits
// for both CTAs' stores before it refills that stage) and in its Q buffer with
// FUSEDATTN_SM90_O_IN_KV=0; d128 has two Q buffers and stages O there. One test per setting and
// dtype, so that the GPU suite's shards share them out.
class Sm90PairedShapes : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(Sm90PairedShapes, PairedShapesMatchReference) {
  SKIP_UNLESS_HOPPER();
  const auto& [o_in_kv, dtype] = GetParam();
  // The pairs alone: the quad mix would take the shapes with query blocks in fours (its own test).
  const ScopedEnvs env(
      {{"FUSEDATTN_SM90_CLUSTER", "1"}, {"FUSEDATTN_SM90_QUAD_MIX", "0"}, {"FUSEDATTN_SM90_O_IN_KV", o_in_kv}});
  SkipReason skipped;
  for (const Problem& pr : paired_shapes()) {
    SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " FUSEDATTN_SM90_O_IN_KV=" + o_in_kv);
    if (!expect_paired(pr, dtype, skipped)) continue;
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
  }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

INSTANTIATE_TEST_SUITE_P(OInKV, Sm90PairedShapes,
                         ::testing::Combine(::testing::Values("1", "0"), ::testing::ValuesIn(kGpuDtypes)),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, DType>>& info) {
                           return std::string("OInKV") + std::get<0>(info.param) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

// The pairs the default dispatch picks, with no switch set: d256 full masks from
// kPairClusterMinKeys keys, up to 4096 keys on the 64-key tile with O staged in K/V
// (kPairOInKVMaxKeys), above it on the 80-key tile with O in the Q buffer.
TEST(Sm90Cluster, DefaultPairsMatchReference) {
  SKIP_UNLESS_HOPPER();
  // Empty reads as unset; the switches are cleared in case the binary runs with them set.
  const ScopedEnvs unset({{"FUSEDATTN_SM90_CLUSTER", ""}, {"FUSEDATTN_SM90_O_IN_KV", ""}});
  struct DefaultCase {
    Problem pr;
    int block_n;
  };
  const DefaultCase cases[] = {{dense(1, 2, 2, 256, cuda::sm90::kPairClusterMinKeys, 256), cuda::sm90::kD256Block64.block_n},
                               {dense(1, 2, 2, 256, cuda::sm90::kBlock64MaxKeys, 256), cuda::sm90::kD256Block64.block_n},
                               {dense(1, 2, 2, 256, 8192, 256), cuda::sm90::tile_shape(256).block_n}};
  SkipReason skipped;
  for (const DType dtype : kGpuDtypes)
    for (const DefaultCase& dc : cases) {
      SCOPED_TRACE(dc.pr.str() + " " + dtype_name(dtype));
      if (!expect_paired(dc.pr, dtype, skipped)) continue;
      EXPECT_EQ(planned_sm90_work(dc.pr, dtype)->shape.block_n, dc.block_n);
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dc.pr, dtype));
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// The tail split (cuda/common/tail_shares.h) of pairs: a share runs the same steps of both query
// blocks of a pair, each CTA writes its own workspace slot, and the last part of each slice
// combines. Forced share counts cut the shares across pairs (several segments each), over an odd
// number of query blocks (the idle CTA of the last pair writes no part), keys not a multiple of
// the block, both d256 widths and GQA. Each against the reference, then again for identical bytes.
constexpr int kSplitRuns = 2;  // a first run and its repeat
TEST(Sm90Cluster, SplitPairsMatchReference) {
  SKIP_UNLESS_HOPPER();
  struct SplitCase {
    Problem pr;
    const char* shares;
  };
  const SplitCase cases[] = {{dense(2, 4, 4, 1024, 1024, 128), "5"},
                             {dense(1, 3, 3, 300, 777, 128), "4"},
                             {dense(1, 8, 2, 200, 600, 128), "3"},
                             {dense(1, 2, 2, 512, 5000, 256), "7"},
                             {dense(2, 2, 2, 640, 2100, 256), "9"}};
  SkipReason skipped;
  for (const DType dtype : kGpuDtypes)
    for (const SplitCase& sc : cases) {
      SCOPED_TRACE(sc.pr.str() + " " + dtype_name(dtype) + " shares " + sc.shares);
      const ScopedEnvs env({{"FUSEDATTN_SM90_CLUSTER", "1"},
                            {"FUSEDATTN_SM90_QUAD_MIX", "0"},
                            {"FUSEDATTN_SM90_TAIL_SHARES", sc.shares}});
      if (!expect_paired(sc.pr, dtype, skipped, Split::kShares)) continue;
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(sc.pr, dtype));
      FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(sc.pr, dtype, kSplitRuns));
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// The unpaired kernel's out and LSE bytes for dc's inputs (c's host copies), under the caller's
// switches, the launch asserted unpaired; nothing where this build has no Hopper forward for pr or
// the run skips (`skipped` then says why).
struct ForwardBytes {
  std::vector<unsigned char> out, lse;
};
std::optional<ForwardBytes> unpaired_bytes(const Problem& pr, DType dtype, HostCase& c, DeviceCase& dc,
                                           SkipReason& skipped) {
  const auto w = expect_sm90_work(pr, dtype, skipped);
  if (!w) return std::nullopt;
  EXPECT_EQ(w->shape.cluster_ctas, 1) << pr.str();
  if (SkipReason why = dc.forward()) {
    if (!skipped) skipped = why;
    return std::nullopt;
  }
  return ForwardBytes{bytes_of(c.out), bytes_of(c.lse)};
}

// The same inputs through the pair and through the unpaired kernel, the tail split off in both:
// identical bytes. Then the pair again, for bit-identical repeats.
TEST(Sm90Cluster, PairMatchesUnpairedToTheBit) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : {dense(2, 4, 4, 1024, 1024, 128), dense(1, 3, 3, 300, 777, 128),
                              dense(1, 2, 2, 640, 2100, 256), dense(1, 2, 2, 512, 5000, 256)}) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
      DeviceCase dc(c);
      std::optional<ForwardBytes> unpaired;
      {
        const ScopedEnvs env({{"FUSEDATTN_SM90_CLUSTER", "0"}, {"FUSEDATTN_SM90_TAIL_SPLIT", "0"}});
        unpaired = unpaired_bytes(pr, dtype, c, dc, skipped);
      }
      if (!unpaired) continue;
      const auto& [out, lse] = *unpaired;
      const ScopedEnvs paired(
          {{"FUSEDATTN_SM90_CLUSTER", "1"}, {"FUSEDATTN_SM90_QUAD_MIX", "0"}, {"FUSEDATTN_SM90_TAIL_SPLIT", "0"}});
      if (!expect_paired(pr, dtype, skipped, Split::kNone)) continue;
      for (int run = 0; run < 2; ++run) {
        FUSEDATTN_RUN_OR_SKIP(dc.forward());
        EXPECT_EQ(bytes_of(c.out), out) << "out differs from the unpaired kernel's, run " << run;
        EXPECT_EQ(bytes_of(c.lse), lse) << "lse differs from the unpaired kernel's, run " << run;
      }
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// The quad mix (fwd_split.h, uses_quad_mix; fwd_launch.cuh, launch_quad_mix): a pair launch's
// items split between clusters of four and pairs on a second stream. Shapes where both launches
// get items, the quads more than one round (62 heads of 4 query blocks, 124 pair items: on the
// H200's 30 quads and 6 pairs QuadMixShares gives the quads 60 quad items, two rounds, and the
// pairs 4; 40 heads, this test's shape until session 95, gave the quads all 80 since session
// 82's shares), or one launch all of them (2 heads: the pairs; 8 heads: the quads); keys beyond
// 4096 (the mix keeps the 64-key tile), not a multiple of the block, and GQA. The plan is asserted
// to mix, then out and LSE against the reference, and to the bit against the unpaired kernel on
// the same 64-key tile (the tail split off there): the clusters change where K/V come from, not
// the arithmetic.
void expect_mix_matches_reference_and_unpaired(std::initializer_list<Problem> problems, int mix_ctas) {
  SkipReason skipped;
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : problems) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
      DeviceCase dc(c);
      std::vector<unsigned char> out, lse;
      {
        // Beyond 4096 keys the unpaired default is the 80-key tile, whose sums run in another order.
        const ScopedEnvs unpaired({{"FUSEDATTN_SM90_CLUSTER", "0"},
                                   {"FUSEDATTN_SM90_TAIL_SPLIT", "0"},
                                   {"FUSEDATTN_SM90_D256_TILE", "64"}});
        const auto w = expect_sm90_work(pr, dtype, skipped);
        if (!w) continue;
        ASSERT_EQ(w->shape.block_n, cuda::sm90::kD256Block64.block_n);
        FUSEDATTN_RUN_OR_SKIP(dc.forward());
        out = bytes_of(c.out);
        lse = bytes_of(c.lse);
      }
      // Forced: by default the pairs (and so the mix) start at kPairClusterMinKeys keys.
      const ScopedEnvs mix({{"FUSEDATTN_SM90_CLUSTER", "1"}, {"FUSEDATTN_SM90_QUAD_MIX", ""}});
      if (!expect_paired(pr, dtype, skipped)) continue;
      const auto mixed = planned_sm90_work(pr, dtype);
      ASSERT_TRUE(mixed.has_value());
      EXPECT_EQ(mixed->quad_mix_ctas, mix_ctas);
      EXPECT_EQ(mixed->shape.block_n, cuda::sm90::kD256Block64.block_n);
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
      // Twice more: the second run without dependent launches, which changes no launch of an
      // eager mix (launch_quad_mix orders its pairs behind the quads' start either way).
      for (const char* pdl : {"", "0"}) {
        const ScopedEnv env("FUSEDATTN_SM90_PDL", pdl);
        FUSEDATTN_RUN_OR_SKIP(dc.forward());
        EXPECT_EQ(bytes_of(c.out), out) << "out differs from the unpaired kernel's, FUSEDATTN_SM90_PDL=" << pdl;
        EXPECT_EQ(bytes_of(c.lse), lse) << "lse differs from the unpaired kernel's, FUSEDATTN_SM90_PDL=" << pdl;
      }
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

TEST(Sm90Cluster, QuadMixMatchesReferenceAndUnpaired) {
  SKIP_UNLESS_HOPPER();
  expect_mix_matches_reference_and_unpaired(
      {dense(1, 62, 62, 512, 300, 256), dense(1, 2, 2, 512, 4500, 256), dense(1, 8, 2, 512, 700, 256)},
      cuda::sm90::kQuadCluster);
}

// The mix with clusters of eight, which query blocks in eights take: the same cases otherwise (62
// heads of 8 query blocks: on the H200's 15 octets and 6 pairs 60 octet items, four rounds, and 8
// pair items).
TEST(Sm90Cluster, OctetMixMatchesReferenceAndUnpaired) {
  SKIP_UNLESS_HOPPER();
  const ScopedEnv octets("FUSEDATTN_SM90_MIX_CLUSTER", "");
  expect_mix_matches_reference_and_unpaired(
      {dense(1, 62, 62, 1024, 300, 256), dense(1, 2, 2, 1024, 4500, 256), dense(1, 8, 2, 1024, 700, 256)},
      cuda::sm90::kOctetCluster);
}

// Pairs under causal and window masks (fwd_split.h, pairs_masked; FUSEDATTN_SM90_CAUSAL_PAIRS=1):
// d256's 80-key tile, rows that see more than 4096 keys. A pair loads the blocks either of its
// query blocks sees, and the first one's slices skip the blocks only the second sees. Causal
// (bottom-right aligned, Sq < Sk), an odd number of query blocks (the last pair's second CTA passes
// its tile through), a partial last query block, GQA, a sliding window, and a local window with a
// right edge; against the reference.
constexpr bool kCausal = true;  // with_mask's second argument
std::vector<Problem> masked_pair_shapes() {
  return {with_mask(dense(1, 2, 2, 512, 5000, 256), kCausal, -1, -1),
          with_mask(dense(1, 2, 2, 640, 4500, 256), kCausal, -1, -1),
          with_mask(dense(1, 4, 2, 300, 4400, 256), kCausal, -1, -1),
          with_mask(dense(1, 2, 2, 512, 6000, 256), !kCausal, 5000, 0),
          with_mask(dense(1, 2, 2, 384, 4800, 256), !kCausal, 4500, 200)};
}

// The same on the 80-key tile forced at short keys (FUSEDATTN_SM90_D256_TILE=80), where the pairs
// stage O in their last K/V stage (fwd_launch.cuh, kPairOInKVMaxKeys): both CTAs' stores read
// before either producer refills it. 68 heads of two query blocks: more pairs than clusters.
std::vector<Problem> short_masked_pair_shapes() {
  return {with_mask(dense(1, 2, 2, 512, 700, 256), kCausal, -1, -1),
          with_mask(dense(1, 68, 68, 256, 300, 256), kCausal, -1, -1),
          with_mask(dense(1, 3, 3, 640, 900, 256), !kCausal, 300, 0)};
}

// d128's pairs (FUSEDATTN_SM90_CAUSAL_PAIRS_128=1) on its square tile, whose slices skip only the
// block the pair's second query block adds: causal with Sq < Sk and Sq == Sk, an odd number of
// query blocks, a partial last one, GQA, a sliding window, a local window with a right edge, and
// 68 heads of two query blocks (more pairs than clusters). With two Q buffers the d128 tile does
// not stage O in K/V (tile_config.h, kStagesOInKV), paired or not.
std::vector<Problem> d128_masked_pair_shapes() {
  return {with_mask(dense(1, 2, 2, 640, 2000, 128), kCausal, -1, -1),
          with_mask(dense(1, 2, 2, 1024, 1024, 128), kCausal, -1, -1),
          with_mask(dense(1, 4, 2, 300, 900, 128), kCausal, -1, -1),
          with_mask(dense(1, 2, 2, 512, 3000, 128), !kCausal, 700, 0),
          with_mask(dense(1, 2, 2, 384, 1800, 128), !kCausal, 500, 100),
          with_mask(dense(1, 68, 68, 256, 300, 128), kCausal, -1, -1)};
}

TEST(Sm90Cluster, MaskedPairsMatchReference) {
  SKIP_UNLESS_HOPPER();
  const ScopedEnv on("FUSEDATTN_SM90_CAUSAL_PAIRS", "1");
  SkipReason skipped;
  for (const char* tile : {"", "80"}) {
    const ScopedEnv forced("FUSEDATTN_SM90_D256_TILE", tile);
    for (const DType dtype : kGpuDtypes)
      for (const Problem& pr : *tile ? short_masked_pair_shapes() : masked_pair_shapes()) {
        SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " FUSEDATTN_SM90_D256_TILE=" + tile);
        if (!expect_paired(pr, dtype, skipped, Split::kNone)) continue;
        EXPECT_EQ(planned_sm90_work(pr, dtype)->shape.block_n, cuda::sm90::tile_shape(256).block_n);
        FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
      }
  }
  const ScopedEnv d128_pairs("FUSEDATTN_SM90_CAUSAL_PAIRS_128", "1");
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : d128_masked_pair_shapes()) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype) + " FUSEDATTN_SM90_CAUSAL_PAIRS_128=1");
      if (!expect_paired(pr, dtype, skipped, Split::kNone)) continue;
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, dtype));
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// The same inputs through the masked pairs and the unpaired kernel: identical bytes (each slice
// computes its own blocks in the same order either way), with the launch's counter handing items
// from rank 0 to its peer, and on the static schedule (FUSEDATTN_SM90_DYNAMIC=0, as in a graph
// capture). 68 heads of two query blocks put more pairs than clusters on an H100 or H200, so
// clusters fetch again; two runs each, and the unpaired kernel again after the pairs (the counter
// the pairs leave at zero for the next launch on the stream).
TEST(Sm90Cluster, MaskedPairsMatchUnpairedToTheBit) {
  SKIP_UNLESS_HOPPER();
  SkipReason skipped;
  for (const DType dtype : kGpuDtypes)
    for (const Problem& pr : {with_mask(dense(1, 68, 68, 256, 4200, 256), kCausal, -1, -1),
                              with_mask(dense(2, 8, 4, 1000, 5000, 256), kCausal, -1, -1),
                              with_mask(dense(1, 16, 16, 640, 6000, 256), !kCausal, 5000, 0),
                              with_mask(dense(1, 68, 68, 256, 2000, 128), kCausal, -1, -1),  // d128
                              with_mask(dense(2, 8, 4, 1000, 3000, 128), !kCausal, 1000, 0)}) {
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
      DeviceCase dc(c);
      std::optional<ForwardBytes> unpaired;
      {
        const ScopedEnv env("FUSEDATTN_SM90_CAUSAL_PAIRS", "0");
        unpaired = unpaired_bytes(pr, dtype, c, dc, skipped);
      }
      if (!unpaired) continue;
      const auto& [out, lse] = *unpaired;
      for (const char* dynamic : {"", "0"}) {
        const ScopedEnvs paired({{"FUSEDATTN_SM90_CAUSAL_PAIRS", "1"},
                                 {"FUSEDATTN_SM90_CAUSAL_PAIRS_128", "1"},
                                 {"FUSEDATTN_SM90_DYNAMIC", dynamic}});
        if (!expect_paired(pr, dtype, skipped, Split::kNone)) continue;
        for (int run = 0; run < 2; ++run) {
          FUSEDATTN_RUN_OR_SKIP(dc.forward());
          EXPECT_EQ(bytes_of(c.out), out) << "FUSEDATTN_SM90_DYNAMIC=" << dynamic << ", run " << run;
          EXPECT_EQ(bytes_of(c.lse), lse) << "FUSEDATTN_SM90_DYNAMIC=" << dynamic << ", run " << run;
        }
      }
      const ScopedEnv again("FUSEDATTN_SM90_CAUSAL_PAIRS", "0");
      FUSEDATTN_RUN_OR_SKIP(dc.forward());
      EXPECT_EQ(bytes_of(c.out), out) << "the unpaired kernel after the pairs";
      EXPECT_EQ(bytes_of(c.lse), lse) << "the unpaired kernel after the pairs";
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// Launches in a row on one stream alternate paired and unpaired kernels of both head dims: each
// leaves nothing behind that the next one reads (the unpaired ones' tile counter and split
// workspace, the pairs' barriers).
TEST(Sm90Cluster, AlternatesWithUnpairedLaunches) {
  SKIP_UNLESS_HOPPER();
  for (const char* cluster : {"1", "0", "1"})
    for (const Problem& pr : {dense(1, 2, 2, 700, 1500, 256), dense(1, 4, 2, 1000, 900, 128)}) {
      SCOPED_TRACE(pr.str() + " FUSEDATTN_SM90_CLUSTER=" + cluster);
      const ScopedEnv env("FUSEDATTN_SM90_CLUSTER", cluster);
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(pr, DType::kBFloat16));
    }
}

}  // namespace
}  // namespace fusedattn::testing
