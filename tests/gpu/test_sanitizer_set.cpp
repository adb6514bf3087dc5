// The small set compute-sanitizer runs (tools/gpu_check.sh filters on *Sanitizer*): ragged and
// square lengths, causal and windowed masks, GQA and varlen through the public API, forward and
// backward, on whichever forward kernel dispatch picks and again with the Hopper kernel turned off.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "reference/column_mask.h"

namespace fusedattn::testing {
namespace {

void run_small_set() {
  const Problem ragged = with_mask(dense(2, 4, 2, 77, 133, 64), true, -1, -1);
  const Problem window = with_mask(dense(1, 2, 2, 150, 90, 128), false, 20, 5);
  const Problem packed_causal = with_mask(packed(2, 1, 64, {17, 0, 70}, {40, 33, 20}), true, -1, -1);
  // Square causal: on the Hopper kernel the first slice of each tile takes its diagonal block at
  // half width (TileMask::kNarrowsFirstBlock), and the last tile's second slice is empty.
  const Problem square_causal = with_mask(dense(1, 2, 1, 192, 192, 128), true, -1, -1);
  // The Hopper d256 tile takes its blocks lowest first (TileMask::kAscending): its slices start at
  // different blocks (TileMask::blocks_before) and the cut diagonal comes last.
  const Problem square_causal_d256 = with_mask(dense(1, 2, 1, 192, 192, 256), true, -1, -1);
  // Keys over six blocks: the Hopper d128 kernel's K and V rings (2 and 3 stages) wrap at
  // different blocks, and a 130-row tile's second slice holds two rows.
  const Problem long_keys = with_mask(dense(1, 2, 1, 130, 700, 128), false, -1, -1);
  for (const Problem& p : {ragged, window, packed_causal, square_causal, square_causal_d256, long_keys}) {
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(p, DType::kFloat16));
    FUSEDATTN_RUN_OR_SKIP(check_backward_gpu(p, DType::kBFloat16));
  }
}

TEST(GpuSanitizer, SmallRaggedDispatchDefault) {
  FUSEDATTN_REQUIRE_GPU();
  run_small_set();
}

TEST(GpuSanitizer, SmallRaggedPortablePath) {
  FUSEDATTN_REQUIRE_GPU();
  PortablePathOnly portable;
  run_small_set();
}

// seqused_k (forward only): sequences that use part of their key rows, or none, or more than
// they have (clamped); a decode-like launch of few tiles over long rows, which the tail split cuts.
void run_seqused_set() {
  Problem ragged = packed(4, 2, 64, {5, 1, 70}, {40, 300, 20});
  ragged.seqused_k = {30, 150, -1};
  Problem decode = packed(8, 2, 128, {1, 1}, {700, 900});
  decode.seqused_k = {650, 3};
  // On the Hopper kernel (every one of these; d256 under full masks only) warpgroup 0 zeroes
  // each sequence's unused V rows.
  Problem wide = packed(4, 2, 256, {3, 70}, {100, 90});
  wide.seqused_k = {70, 33};
  for (const Problem& p : {ragged, with_mask(ragged, true, -1, -1), decode, with_mask(decode, true, -1, -1), wide})
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(p, DType::kFloat16));
}

TEST(GpuSanitizer, VarlenSequsedKDispatchDefault) {
  FUSEDATTN_REQUIRE_GPU();
  run_seqused_set();
}

TEST(GpuSanitizer, VarlenSequsedKPortablePath) {
  FUSEDATTN_REQUIRE_GPU();
  PortablePathOnly portable;
  run_seqused_set();
}

// The portable forward's key split (fwd_kv_split.h): parts to the workspace, then the combine.
TEST(GpuSanitizer, PortableKeySplit) {
  FUSEDATTN_REQUIRE_GPU();
  PortablePathOnly portable;
  Problem used = packed(4, 2, 64, {1, 1, 2}, {3000, 3000, 3000});
  used.seqused_k = {2999, 0, 1200};
  for (const Problem& p : {dense(1, 8, 2, 1, 2100, 128), dense(1, 2, 2, 3, 1500, 64), used})
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(p, DType::kFloat16));
}

// Column masks (the portable kernels, where dispatch sends them): causal documents packed into
// one sequence, whose later query blocks skip key blocks whole, and a sliding window written as
// two intervals per key over a GQA call with one mask per query head; forward and backward, each
// against the reference of what the mask equals, the backward also in deterministic mode (its dQ
// turns start at each query block's first adding KV block: sm80/bwd_column_spans.cuh).
TEST(GpuSanitizer, ColumnMaskDocumentsAndTwoIntervals) {
  FUSEDATTN_REQUIRE_GPU();
  const std::vector<int64_t> docs = {70, 1, 129, 33};
  const int64_t total = total_length(docs), sq = 150, sk = 190;
  Columns documents(1, 1, total, 1), window(2, 4, sk, 2);
  hide_later_documents(documents, 0, 0, docs);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h) hide_outside_window(window, b, h, sq, sk, 40, 10);
  const Problem window_call = dense(2, 4, 2, sq, sk, 64);
  const std::vector<std::tuple<Problem, Problem, Columns*>> cases = {
      {with_mask(dense(1, 2, 1, total, total, 64), true, -1, -1), with_mask(packed(2, 1, 64, docs, docs), true, -1, -1),
       &documents},
      {window_call, with_mask(window_call, false, 40, 10), &window}};
  for (const auto& [call, truth, m] : cases) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(call, DType::kFloat16, Layout::kBSHD, rng);
    DeviceCase dc(c);
    const DeviceTensor mask(m->bounds);
    ForwardArgs f = dc.forward_args();
    f.options.column_mask = mask.view(m->bounds);
    BackwardArgs b = dc.backward_args();
    b.options.column_mask = f.options.column_mask;
    FUSEDATTN_RUN_OR_SKIP(dc.forward(f));
    for (const bool deterministic : {false, true}) {
      b.deterministic = deterministic;
      FUSEDATTN_RUN_OR_SKIP(dc.backward(b));
      expect_masked_results(c, truth, {}, atol_for(DType::kFloat16), kLseAtol);
    }
  }
}

// Forward checks with slack 0, so nearly every unmasked step fails the sum check: the warps
// rebase the block from its probabilities, and with REBASE=0 compute their scores again from Q and
// K in shared memory (Consumer::rescore) while their P V is in flight.
void run_with_failing_sum_checks(const std::vector<std::pair<Problem, DType>>& cases) {
  const ScopedEnv slack("FUSEDATTN_SM90_RESCALE_SLACK", "0");
  for (const char* rebase : {"1", "0"}) {
    const ScopedEnv scoped("FUSEDATTN_SM90_REBASE", rebase);
    for (const auto& [problem, dtype] : cases) FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(problem, dtype));
  }
}

// d64's 192-row tile (full masks from 512 rows).
TEST(GpuSanitizer, TallTileRescoredSteps) {
  FUSEDATTN_REQUIRE_GPU();
  run_with_failing_sum_checks({{dense(1, 2, 1, 520, 400, 64), DType::kBFloat16}});
}

// Masked tiles whose unmasked steps check the sums over S (Consumer::kSumCheckInPlace): d128's and
// d64's 128-row tiles with one P buffer, d256's 64-key tile (up to kBlock64MaxKeys keys a row)
// with two. d64's masked launches take the 128-row tile only past 2048 keys a row (fwd_split.h).
TEST(GpuSanitizer, MaskedTilesRescoredSteps) {
  FUSEDATTN_REQUIRE_GPU();
  run_with_failing_sum_checks({{with_mask(dense(1, 2, 1, 300, 2200, 64), true, -1, -1), DType::kFloat16},
                               {with_mask(dense(1, 2, 1, 300, 420, 128), true, -1, -1), DType::kFloat16},
                               {with_mask(dense(1, 2, 1, 300, 420, 256), true, -1, -1), DType::kFloat16}});
}

// More tiles than an H100/H200 has SMs, so CTAs run tiles back to back on the two-Q-buffer tiles
// (d128, d64's 128-row tile), whose next Q loads while a tile runs: full (static schedule), causal
// (dynamic) and windowed tiles.
TEST(GpuSanitizer, TilesBackToBack) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnv d64_tile("FUSEDATTN_SM90_D64_TILE", "128");
  for (int d : {64, 128})
    for (const Problem& p : {dense(1, 40, 8, 530, 130, d), with_mask(dense(1, 40, 8, 530, 300, d), true, -1, -1),
                             with_mask(dense(1, 40, 40, 530, 300, d), false, 150, 10)})
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(p, DType::kFloat16));
}

// A head dim's tile cases: ragged full, causal and windowed (GQA) launches, and more tiles than
// SMs so CTAs run tiles back to back.
std::vector<Problem> tile_problems(int d) {
  return {dense(1, 2, 1, 200, 350, d), with_mask(dense(1, 2, 2, 190, 190, d), true, -1, -1),
          with_mask(dense(1, 40, 8, 300, 260, d), false, 100, 10), dense(1, 40, 8, 530, 130, d)};
}

// The tile cases with each of a head dim's KV block widths forced (env); then, on each width,
// O staged in its Q buffer or slot (FUSEDATTN_SM90_O_IN_KV=0) instead of the last K/V stage
// (on d256's 64-key tile both warpgroups then stage in their own Q slots, session 46).
void run_block_widths(int d, const char* env, std::initializer_list<const char*> widths) {
  for (const char* width : widths) {
    const ScopedEnv tile(env, width);
    for (const Problem& p : tile_problems(d)) FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(p, DType::kBFloat16));
  }
  const ScopedEnv o_in_q("FUSEDATTN_SM90_O_IN_KV", "0");
  for (const char* width : widths) {
    const ScopedEnv tile(env, width);
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 40, 8, 530, 130, d), DType::kFloat16));
  }
}

// d192's two tiles (session 30): 64-key blocks with two Q buffers and 112-key blocks with one.
TEST(GpuSanitizer, Head192Tiles) {
  FUSEDATTN_REQUIRE_GPU();
  run_block_widths(192, "FUSEDATTN_SM90_D192_TILE", {"64", "112"});
}

// d256's two tiles, both with one Q buffer: 64-key and 80-key blocks.
TEST(GpuSanitizer, Head256Tiles) {
  FUSEDATTN_REQUIRE_GPU();
  run_block_widths(256, "FUSEDATTN_SM90_D256_TILE", {"64", "80"});
}

// d96 (session 30): d128's tile with a half-used last slab (Q K^T over six k-steps, P V of N = 96,
// O's second box half out of bounds), over the tile cases.
TEST(GpuSanitizer, Head96Tiles) {
  FUSEDATTN_REQUIRE_GPU();
  for (const Problem& p : tile_problems(96)) FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(p, DType::kFloat16));
}

// The tail's shares crossing tiles (cuda/common/tail_shares.h, forced): parts of unequal lengths,
// two or three per tile, their tickets and the combine, under both schedules.
TEST(GpuSanitizer, TailSharesCrossTiles) {
  FUSEDATTN_REQUIRE_GPU();
  for (const char* dynamic : {"0", "1"}) {
    const ScopedEnvs env({{"FUSEDATTN_SM90_TAIL_SHARES", "23"}, {"FUSEDATTN_SM90_DYNAMIC", dynamic}});
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 1024, 1100, 128), DType::kFloat16));
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 600, 1500, 256), DType::kBFloat16));
  }
}

// Decode steps (one to three queries per sequence, a GQA group packed into a tile's rows, the keys
// split into parts): K/V maps with 128-byte L2 promotion (fwd_split.h, kv_l2_promotes_128b).
TEST(GpuSanitizer, DecodeSteps) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(3, 8, 2, 1, 5000, 128), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(2, 4, 1, 3, 3000, 256), DType::kBFloat16));
  // Tiles in more than kTailMaxParts parts (fwd_split.h, few_rows_parts): rounds of parts in flight.
  const ScopedEnv finer("FUSEDATTN_SM90_FEW_ROWS_PARTS", "32");
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 16, 4, 1, 9000, 256), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 32, 8, 1, 3000, 64), DType::kBFloat16));
}

// CTA pairs sharing K/V by multicast (tile_config.h, kPairCluster), forced: the peer's arrivals
// on this CTA's empty barriers (and at d256 on its o_read barriers: O staged in K/V), a last pair
// with one block past the sequence, and keys fewer than half a block (the second CTA's share
// wholly past them).
TEST(GpuSanitizer, ClusterPairs) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnv paired("FUSEDATTN_SM90_CLUSTER", "1");
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 3, 3, 300, 777, 128), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 256, 30, 256), DType::kBFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 384, 5000, 256), DType::kFloat16));
  // More pairs than clusters, two KV blocks per tile: a CTA's consecutive tiles stage O in one stage.
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 68, 68, 256, 128, 256), DType::kFloat16));
  // Shares across pairs (each CTA's workspace slot, the tickets, the combine) and the idle CTA.
  const ScopedEnv shares("FUSEDATTN_SM90_TAIL_SHARES", "4");
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 3, 3, 300, 777, 128), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 3, 3, 300, 777, 256), DType::kBFloat16));
}

// The quad mix (fwd_launch.cuh, launch_quad_mix), forced at lengths below the default's: clusters
// of four (their peers' arrivals on each CTA's empty and o_read barriers) beside pairs on a
// second stream, each on its share of the items (62 heads of 4 query blocks: on the H200 two
// rounds of quads and 4 pair items); keys past 4096 on the 64-key tile, not a multiple of it.
TEST(GpuSanitizer, QuadMix) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnvs env({{"FUSEDATTN_SM90_CLUSTER", "1"}, {"FUSEDATTN_SM90_QUAD_MIX", ""}});
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 62, 62, 512, 300, 256), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 512, 4500, 256), DType::kBFloat16));
}

// The same with clusters of eight, which query blocks in eights take.
TEST(GpuSanitizer, OctetMix) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnvs env(
      {{"FUSEDATTN_SM90_CLUSTER", "1"}, {"FUSEDATTN_SM90_QUAD_MIX", ""}, {"FUSEDATTN_SM90_MIX_CLUSTER", ""}});
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 62, 62, 1024, 300, 256), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2, 2, 1024, 4500, 256), DType::kBFloat16));
}

// Pairs under causal and window masks (FUSEDATTN_SM90_CAUSAL_PAIRS=1): rank 0 hands each item it
// fetches to its peer through distributed shared memory (the fetch slots and their barriers), the
// first query block's slices skip the blocks only the second sees, and an odd number of query
// blocks leaves the last pair's second CTA a tile to pass through. Keys past 4096 take d256's
// 80-key tile; with it forced at 300 keys (FUSEDATTN_SM90_D256_TILE=80), 68 heads of two query
// blocks put more pairs than clusters (second fetches) and the pairs stage O in K/V. Then d128's
// pairs (FUSEDATTN_SM90_CAUSAL_PAIRS_128=1), whose square tile's slices skip the pair's added block.
TEST(GpuSanitizer, MaskedPairs) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnv paired("FUSEDATTN_SM90_CAUSAL_PAIRS", "1");
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(with_mask(dense(1, 2, 2, 384, 4200, 256), true, -1, -1), DType::kFloat16));
  FUSEDATTN_RUN_OR_SKIP(
      check_forward_gpu(with_mask(dense(1, 2, 2, 256, 4500, 256), false, 4200, 30), DType::kBFloat16));
  {
    const ScopedEnv long_tile("FUSEDATTN_SM90_D256_TILE", "80");
    FUSEDATTN_RUN_OR_SKIP(
        check_forward_gpu(with_mask(dense(1, 68, 68, 256, 300, 256), true, -1, -1), DType::kFloat16));
  }
  // d128's pairs (FUSEDATTN_SM90_CAUSAL_PAIRS_128=1): three query blocks, and a window.
  const ScopedEnv d128_pairs("FUSEDATTN_SM90_CAUSAL_PAIRS_128", "1");
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(with_mask(dense(1, 68, 68, 384, 1000, 128), true, -1, -1), DType::kBFloat16));
  FUSEDATTN_RUN_OR_SKIP(
      check_forward_gpu(with_mask(dense(1, 2, 2, 512, 1500, 128), false, 600, 0), DType::kFloat16));
}

}  // namespace
}  // namespace fusedattn::testing
