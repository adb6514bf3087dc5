// The Hopper forward's work list (host side, plain C++ so the GPU tests can ask for it too): the
// tile shape a launch uses and, for full masks, how the last wave of its equal query tiles is
// cut into shares of their KV blocks (cuda/common/tail_shares.h). Work items in scheduler order
// are the tiles [0, whole) run whole, then the shares of the other tiles, in the tiles' order.
// Masked launches keep one item per tile (their tiles differ in length; the longest-first order
// balances them).
#pragma once

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "cuda/common/env.h"
#include "cuda/common/int_math.h"
#include "cuda/common/kinds.h"
#include "cuda/common/tail_shares.h"
#include "cuda/sm90/row_packing.h"
#include "cuda/sm90/tile_config.h"
#include "fusedattn/attention.h"  // kCudaPageRows
#include "fusedattn/params.h"
#include "fusedattn/tensor.h"  // dtype_size

namespace fusedattn::cuda::sm90 {

// The plan's cost model in KV-block steps. A tile's prologue (Q and the first K/V in flight, the
// first Q K^T alone) and epilogue (normalise, stage, store) take about 1.5 steps (a model guess).
// A part also writes its fp32 O and LSE rows and the last part reads every part's rows back: that
// traffic grows with the head dim while a step's K/V block does not (80 keys at d256), so a part
// costs 1 + head_dim / 128 steps. With the first guess (one step at every head dim) the A/B on the
// H200 (fp16, TFLOP/s, split on / off, two repetitions in one call) had d128 full 16k 636-641 /
// 604-635 and d256 full 16k 708 / 664-680 but d256 full 8k 678-690 / 701-708 and d64 full 1k
// 424-429 / 430-433: those two no longer split. The plan now weighs balanced shares as well
// (cuda/common/tail_shares.h), which fill the last round where no number of equal parts does.
// H200 fp16, medians of seven, one process, shares / unsplit: d128 full 4k 662 / 651, 8k 685 /
// 668; d256 full 4k 703 / 696, 8k 712 / 717 (the power-capped d256 gains little from a fuller
// last round); d256 full 16k shares / unsplit / the equal parts of the earlier plan 710 / 701 /
// 685 (docs/perf.md, thirty-first session).
constexpr double kFwdTileSteps = 1.5;
constexpr double kFwdPartStepsPerHeadDim = 1.0 / 128;

inline TailCost fwd_tail_cost(int head_dim) {
  return {kFwdTileSteps, 1.0 + kFwdPartStepsPerHeadDim * head_dim};
}

// FUSEDATTN_SM90_TAIL_SPLIT=0 runs every tile whole (A/B measurements); on by default.
inline bool tail_split_enabled() { return env_switch_or("FUSEDATTN_SM90_TAIL_SPLIT", true); }

// FUSEDATTN_SM90_TAIL_SHARES=S cuts the last wave's tiles (all of them below one wave) into S
// shares whatever the model prefers, so the tests reach shares that cross tiles; 0 when unset. A
// count that would cut a tile into more parts than the launch allows is ignored (fwd_work).
inline int forced_tail_shares() {
  const char* v = std::getenv("FUSEDATTN_SM90_TAIL_SHARES");
  return v ? std::atoi(v) : 0;
}

// A decode step's launch (fewer tiles than SMs, each combined spread over the warpgroup) streams
// its caches on as many CTAs as its tiles have parts: 8 tiles of 8 parts are 64 of the H200's 132
// SMs. On the H200 (d128 fp16, 32 query heads on 8, one query; docs/hopper.md, session 90) 64 CTAs
// stream ~4.3 TB/s once started and 128 ~4.5, but each part also pays a fixed cost (its first K
// ~4,700 cycles after its start, its rows' write and ticket, a share of the combine): 16 parts
// against 8 read -3.0% time at 128k keys (4 MiB of K/V a part) in the CLI and -0.9% in
// bench_points (session 91), even at 32k, +7% at 4k (session 89). So a tile takes more than
// kTailMaxParts parts only up to one CTA a slot and while each part keeps kFewRowsMinPartBytes of
// K and V to stream.
constexpr int64_t kFewRowsMinPartBytes = int64_t{4} << 20;

// How finely the plan may cut each of `tiles` few-row tiles on `slots` CTAs, where each tile
// streams kv_bytes of K and V: at most max_parts parts of at least min_part_steps KV blocks each.
// FUSEDATTN_SM90_FEW_ROWS_PARTS=N (2 .. kFewRowsMaxParts) allows N parts whatever the lengths, and
// above kTailMaxParts parts of one block, so the tests reach many parts on short caches.
struct FewRowsParts {
  int max_parts;
  int min_part_steps;
};

inline FewRowsParts few_rows_parts(int64_t tiles, int64_t slots, int64_t kv_bytes) {
  const char* v = std::getenv("FUSEDATTN_SM90_FEW_ROWS_PARTS");
  const int forced = v ? std::min(std::atoi(v), kFewRowsMaxParts) : 0;
  if (forced >= 2) return {forced, forced > kTailMaxParts ? 1 : kTailMinPartSteps};
  const int64_t by_slots = slots / std::max<int64_t>(tiles, 1);
  const int64_t by_bytes = kv_bytes / kFewRowsMinPartBytes;
  return {static_cast<int>(std::clamp<int64_t>(std::min(by_slots, by_bytes), kTailMaxParts, kFewRowsMaxParts)),
          kTailMinPartSteps};
}

// The tile order's group under masks (common/schedule.h: the pairs whose K/V fit a share of the
// L2 go longest-first together) is halved where each (head, batch) pair has at most
// kShortQueryTiles query tiles on the one-CTA-per-SM d128/d256 tiles: short causal heads, whose
// launches stream Q, K, V and O through the L2 at close to the memory's rate. fp16 TFLOP/s, one
// process per card, the full group / half (docs/hopper.md, session 28): H100 d256 causal 512
// 298.8 / 311.3, d128 causal 512 304.3 / 317.5, 512 queries x 4096 keys d128 296.2 / 309.3;
// H200 344.4 / 355.2, 341.7 / 345.4, 299.8 / 310.4. At 1k (8 tiles) half lost 1-5% at d256, and
// d64's pair tile at 512 loses 1-6% with any smaller group, so they keep the full one. Masked
// decode steps (one tile per pair) take half too; there the long caches keep groups of 1-2 pairs
// anyway, and no decode point was measured with it. d192 (session 31, H200 causal 512, medians of
// three) gains as d256 does: 367.5 with half (16 pairs) against 351.4 with the full group (32).
// d96 runs d128's one-CTA tile but reads better with the full group (64 pairs) in two processes:
// 306.1 / 307.1 against 298.0-300.4 / 299.4 with half (why is not known), so it keeps it.
constexpr int64_t kShortQueryTiles = 4;
constexpr int kShortQueryGroupDivisor = 2;
constexpr int kShortQueryGroupMinHeadDim = 128;
inline int schedule_group_divisor(int instance_head_dim, TileShape shape, int64_t query_tiles_per_pair) {
  const bool short_heads = query_tiles_per_pair <= kShortQueryTiles;
  return shape.ctas_per_sm == 1 && instance_head_dim >= kShortQueryGroupMinHeadDim && short_heads
             ? kShortQueryGroupDivisor
             : 1;
}

// The most keys one query row of p sees: a window's width (both sides bounded), at most the key
// sequence. How long a tile's KV loop runs follows from it, and with that which tile is fastest.
inline int64_t keys_per_row(const FwdParams& p) {
  if (p.window_left < 0 || p.window_right < 0) return p.seqlen_k;
  const int64_t width = p.window_left + p.window_right + 1;
  return width < p.seqlen_k ? width : p.seqlen_k;
}

// d64: the 192-row tile where the query sequence (its tiled rows, see TiledRows) is long enough that the third consumer
// warpgroup gains more than the partial last tile costs, a shorter one otherwise. A
// warpgroup with no rows in the last tile skips its work (consumer.cuh), so with a full mask
// 192 rows win from 512 queries: H200 fp16 TFLOP/s, default (128) vs forced 192, one call, two
// repetitions: 512 370-373 vs 392-397, 1k 406-408 vs 426-427. Below 2k queries 192 rows lose to
// 128 under causal masks (causal 1k 318-325 vs 309-310; 512 even); at 2k and above 192 wins for
// both (before the skip: full 2k 1.05 vs 0.98, causal 2k 1.02 vs 0.99, 4k 1.08 vs 1.00
// ours/cuDNN). Below 2k queries masked tiles are short (a causal 512-query head: 1 to 4
// blocks), and the 128 x 64 tile of two CTAs per SM (kD64Pair) hides one CTA's tile boundaries
// under the other's loop: H200 fp16 TFLOP/s, pair / 128-row tile, both in one process, three calls: causal 512
// 287-292 / 244-247, 1k 346-362 / 321-327, 2k 391-408 / 370-385 (192 rows: 400-416). Measured
// with at most 2048 keys; longer key ranges (long tiles, whose boundaries cost little) keep 128
// rows. Full masks gain nothing from it (512: 366-383 / 380-388 with 192 rows). A sliding window
// makes every tile short whatever the lengths: up to kD64PairMaxWindowKeys keys per row the pair
// tile wins at any query length (H200 fp16 TFLOP/s, 4k and 16k queries, pair / 192 rows, one
// process: window 128 167 / 131-135, 256 248-250 / 209-213, 512 317-320 / 292-299; 1024 even,
// 2048 behind; docs/hopper.md, session 21).
// FUSEDATTN_SM90_D64_TILE=128|192|pair forces one ("192o", its name while a 192-row tile without
// the overlap existed, still means 192). A seqused_k or paged launch takes the 128-row tile
// whatever is forced: only its warpgroups' GEMM turns order the zeroing of a sequence's unused V
// rows before every P V that reads them (Consumer::clear_unused_v_rows; the pair tile has no
// turns, the tall one's masked slices skip blocks).
constexpr int64_t kD64TallMinQueries = 2048;
constexpr int64_t kD64TallMinQueriesFullMask = 512;
constexpr int64_t kD64PairMaxKeys = 2048;
constexpr int64_t kD64PairMaxWindowKeys = 1024;

enum class D64Tile { kTable, kTall, kPair };

// row_keys: the most keys one query row sees (keys_per_row); clears_v: a launch that zeroes
// unused V rows (loads_unwritten_rows: seqused_k or paged K/V).
// Column masks take the pair tile, or the 128-row one where forced (128); never the 192-row tile,
// whose consumers would get 152 registers beside the column producer's 40 (it is laid out for
// 160). The pair's 64-key blocks leave out more of what a mask hides, and its two CTAs per SM
// hide each other's tile boundaries, which weigh most where documents are short. H200 fp16
// forward of packed causal documents (16k tokens, d64, tools/bench_documents.py), ms, 128-row /
// pair tile, two calls of two rounds: 8 x 2k 0.406-0.408 / 0.395-0.398, 128..4k 0.627-0.637 /
// 0.614-0.626, 32..512 0.249-0.255 / 0.198-0.199; but one long document among 64 short ones
// 1.487 / 1.516-1.541 (long first) and 1.50-1.52 / 1.541-1.632 (long last), where long tiles make
// the boundaries cheap and the 128-row tile's overlapped loop pays, as for causal masks beyond
// 2048 keys above. The host cannot tell the documents' lengths without reading the mask, so the
// pair is the default (docs/hopper.md, session 56).
inline D64Tile d64_tile(MaskKind mask, int64_t rows, int64_t row_keys, bool clears_v) {
  if (clears_v) return D64Tile::kTable;
  const char* v = std::getenv("FUSEDATTN_SM90_D64_TILE");
  const std::string forced = v ? v : "";
  if (mask == MaskKind::kColumn) return forced == "128" ? D64Tile::kTable : D64Tile::kPair;
  if (forced == "pair") return D64Tile::kPair;
  if (forced == "128") return D64Tile::kTable;
  if (forced == "192" || forced == "192o") return D64Tile::kTall;
  if (mask == MaskKind::kFull) return rows >= kD64TallMinQueriesFullMask ? D64Tile::kTall : D64Tile::kTable;
  if (row_keys <= kD64PairMaxWindowKeys) return D64Tile::kPair;
  if (rows >= kD64TallMinQueries) return D64Tile::kTall;
  return row_keys <= kD64PairMaxKeys ? D64Tile::kPair : D64Tile::kTable;
}

// d256: 64-key blocks (kD256Block64) for launches whose rows see at most 4096 keys, 80 otherwise.
// H200 fp16 TFLOP/s, 64 / 80, one process, both column orders: causal 512 337-341 / 322-324,
// 1k 472-479 / 461-462, 2k 564-569 / 554-558; causal 4k-16k within 1%; full 16k 670-700 /
// 703-722 (docs/hopper.md, session 20). Full masks up to 4096 keys, with the static schedule they
// now run under (fwd_launch.cuh), medians of 4, fp16 / bf16: 512 +2.8 / +2.6%, 1k +1.4 / -0.2%,
// 2k +0.8 / +0.4%, 4k +1.2-3.1 / +0.4-1.5% (session 25). Long key ranges under a mask keep 80 (a
// short query block sees them all, like a full mask). What counts is the keys a row sees: sliding
// windows of 128-2048 keys over 4k and 16k queries, 64 / 80: +2 to +12% (docs/hopper.md,
// session 21).
// FUSEDATTN_SM90_D256_TILE=64|80 forces one.
// d192 (kD192 / kD192Block64) takes the same rule (session 30). H200 fp16, 16 heads, medians of
// two readings in one process, 64 / 112 keys: full 1k 594 / 572, 2k 651 / 648, 4k 666 / 673, 8k
// 691 / 689, 16k 679 / 704; causal 1k 464 / 452, 2k 561 / 553, 4k 607 / 620, 8k 657 / 647, 16k
// 663 / 673: 64 ahead up to 2k, 112 from 4k but for causal 8k, most within the +-3% noise.
// FUSEDATTN_SM90_D192_TILE=64|112 forces one.
constexpr int64_t kBlock64MaxKeys = 4096;  // inclusive

// The instances with a 64-key tile beside their table shape, and that tile.
constexpr bool has_block64_tile(int instance_head_dim) { return instance_head_dim == 192 || instance_head_dim == 256; }
constexpr TileShape block64_tile(int instance_head_dim) {
  return instance_head_dim == 192 ? kD192Block64 : kD256Block64;
}

// The width FUSEDATTN_SM90_D<head dim>_TILE forces on the instance for instance_head_dim (192 or
// 256): true for block64_tile's, false for the table's, nullopt where it names neither.
inline std::optional<bool> forced_block64(int instance_head_dim) {
  const std::string name = "FUSEDATTN_SM90_D" + std::to_string(instance_head_dim) + "_TILE";
  const char* v = std::getenv(name.c_str());
  const std::string forced = v ? v : "";
  const std::string narrow = std::to_string(block64_tile(instance_head_dim).block_n);
  if (forced == narrow || forced == std::to_string(tile_shape(instance_head_dim).block_n)) return forced == narrow;
  return std::nullopt;
}

// Whether the instance for instance_head_dim (192 or 256) runs 64-key blocks.
inline bool uses_block64(int instance_head_dim, int64_t row_keys) {
  return forced_block64(instance_head_dim).value_or(row_keys <= kBlock64MaxKeys);
}

// Full masks at d128/d256 up to this many keys take the static round robin (equal tiles, no
// atomic fetch in the producer's path at each boundary) instead of the dynamic schedule: H200,
// one process, medians of 4, fp16 / bf16, static against dynamic: d256 full 512 +3.9 / +3.5%, 1k
// +1.5 / +2.8%, 2k +3.2 / +3.4%, 4k -0.2-3.6 / +1.6-2.0%; d128 512 +2.1 / +0.9%, 1k +1.3 /
// +0.9%, 2k +2.3 / +3.2%, 4k 0 / +1%; at 8k -0.5 to +2.3% in one call and -8% in another
// (docs/hopper.md, session 25). d64 keeps the dynamic one (512 -3.4 / -3.6%, 1k -2 to -3%), as do
// variable-length batches, whose tiles differ in length. d96 (d128's tile) and d192 take it too:
// against the dynamic one at 1k / 4k (H200, session 31, medians of three) d96 +0.8 / +1.0%, d192
// +1.7 / -1.5%, within the noise of identical configurations.
constexpr int64_t kStaticScheduleMaxKeys = 4096;
inline bool prefers_static_schedule(const FwdParams& p, MaskKind mask, int instance_head_dim) {
  return mask == MaskKind::kFull && instance_head_dim > 64 && p.cu_seqlens_q == nullptr &&
         p.seqlen_k <= kStaticScheduleMaxKeys;
}

// GQA packing: a tile's rows are the query rows of all `group` query heads that share one KV
// head, position-major (tiled row r = position r / group of query head group * kv_head + r %
// group), so a short query sequence fills the tile with the group's heads instead of rows past
// its end, and one K/V load serves the whole group. The group must be a power of two that divides
// a warpgroup's 64 rows (each warpgroup's slice, and so each TMA box, holds whole positions).
struct TiledRows {
  RowPacking packing;  // shift 0: unpacked
  int64_t rows;        // tiled rows per (tile head, batch)
  int heads;           // tile heads
  // Query blocks of block_m tiled rows per (tile head, batch), the last one possibly cut.
  int64_t blocks(int block_m) const { return ceil_div(rows, block_m); }
};
constexpr int64_t kMaxTiledRows = int64_t{1} << 31;  // tiled rows are int32 in the kernel

inline TiledRows tiled_rows(const FwdParams& p, int pack_shift) {
  const RowPacking packing{pack_shift};
  return {packing, packing.rows(p.seqlen_q), packing.tile_heads(p.heads_q)};
}

// Decode steps: launches of at most kDecodeTileRows tiled rows per (tile head, batch) (a packed
// GQA group of up to 8 query heads, or one query of up to 8 heads; a variable-length batch by its
// longest sequence). Every tile's rows in use then lie in the first half of each warp's 16 rows
// (Consumer::one_row_slice), and the launch takes the tile's decode kernel where it has one
// (tile_config.h, decode_tile; fwd_launch.cuh, launch_fwd_maybe_paired).
constexpr int64_t kDecodeTileRows = kWarpgroupRows / kWarpsPerWarpgroup / 2;
inline bool runs_decode_tile(const TiledRows& rows) { return rows.rows <= kDecodeTileRows; }

// Pairs of CTAs in a cluster sharing each K/V block by multicast (tile_config.h, kPairCluster):
// the d128 and d256 instances' one-CTA tiles, under full masks of dense batches (a pair's two
// query blocks see the same keys; a variable-length batch's tiles are counted in the kernel, so
// its pairs could straddle sequences). A (head, batch) with an odd number of query blocks leaves
// one CTA of its last pair idle, so those pair only from kPairClusterMinOddBlocks blocks, where
// that costs at most 1/kPairClusterMinOddBlocks of its tiles. The pairs spend fewer joules per
// FLOP (half the K/V reads out of the L2), which under the power cap is clock, and a few cycles
// on their coupled K/V ring. H200 fp16, FA grid, TFLOP/s unpaired / paired in one process
// (docs/hopper.md, session 36), medians of three: d128 full 1k 601 / 576, 2k 640 / 624, 4k 645 /
// 668, 8k 674 / 688, 16k 690 / 693; d256 full 1k 614 / 595, 2k 663 / 652, 4k 689 / 684, 8k 714 /
// 714, 16k 711 / 727. Sustained (tools/bench_power.py), two calls: d256 full 8k 676 / 686 and 686
// / 693 (1474 / 1506 MHz), 16k 690 / 707 (1453 / 1498 MHz), the FLOP per SM-cycle within 1%; but
// d128 full 8k 669 / 666, and in medians of five d128 full 4k 671 / 664. So d256 pairs by default
// from kPairClusterMinKeys keys; d128's pairs read even and run only when forced. With O staged
// in K/V (session 37, fwd_launch.cuh's kPairOInKVMaxKeys) the d256 pairs came level below 8k:
// fp16 full 4k unpaired / paired 695 / 698, 680 / 689 and 674.5 / 677 (medians of five, three,
// five), sustained 656.5 / 661.0; bf16 716 / 716; 2k even (678 / 676, 660 / 669, 668 / 668;
// sustained 626 / 627). So from 4096 keys, where every fp16 reading put the pairs ahead. Since
// warpgroup 0's Q has slots of its own (session 46) the pairs lead at 2k too: fp16 full 2k
// paired / unpaired 687 / 665 (medians of three), then 682 and 668 (two paired columns) / 667,
// bf16 704 and 712 / 703 (medians of five); 1k even (629 / 628, bf16 648 / 646; docs/hopper.md,
// session 70). So from 2048 keys.
// FUSEDATTN_SM90_CLUSTER=0|1 turns them off, or on wherever they are supported.
constexpr int64_t kPairClusterMinKeys = 2048;
// Whether a launch stores each consumer warpgroup's O slice as one TMA box (KernelParams::
// o_one_box): where its tile stages each warpgroup's O in shared memory of its own
// (one_box_staging, Epilogue::kOneBoxStaging), for unpacked rows (pack_shift 0) of a dense batch
// (a variable-length batch copies a sequence's last rows from the per-slab layout, store_rows)
// whose head_dim fills the tile's slabs (tile_cols), so the TMA clips no column within a slab.
// FUSEDATTN_SM90_O_ONE_BOX=0 stores one box per slab. H200, fp16 d256 full 2k / 4k: the tile period
// 0.6% / 0.3% shorter in the trace, TFLOP/s +1.2% / +0.1% (medians of five; docs/hopper.md, session 74).
inline bool stores_o_as_one_box(const FwdParams& p, bool one_box_staging, int pack_shift, int tile_cols) {
  return one_box_staging && pack_shift == 0 && p.cu_seqlens_q == nullptr && p.head_dim == tile_cols &&
         env_switch_or("FUSEDATTN_SM90_O_ONE_BOX", true);
}

constexpr int64_t kPairClusterMinOddBlocks = 15;
constexpr bool has_pair_cluster(int instance_head_dim) { return instance_head_dim == 128 || instance_head_dim == 256; }
constexpr bool pairs_by_default(int instance_head_dim) { return instance_head_dim == 256; }
// Pairs under causal and window masks (MaskKind::kWindow): d256's 80-key tile (the longer keys,
// above kD256Block64's), dense K/V. The two query blocks of a pair load the blocks either sees, so
// the first one's slices skip the last block or two the second sees (Consumer::mma_tile), and the
// pairs go longest first through the launch's counter, rank 0 handing each item to its peer
// (Producer::next_tile). H100, paired / unpaired in one process (bench_points and bench_power,
// fp16 and bf16; six readings at 8k, eight at 16k): d256 causal 8k +0.0 to +4.7%, 16k -1.6 to
// +5.3%, medians +2-3%; windows of 4k-8k keys over 8k-16k queries +1.6 to +4.8%. Half the K/V
// reads bounded it at +3-7% (docs/hopper.md, session 112). FUSEDATTN_SM90_CAUSAL_PAIRS=0 turns
// them off.
// d128's square tile pairs the same way, its slices then skipping the block only the pair's later
// tile sees (TileMask::kSlicesSkipBlocks). H100, paired / unpaired in one process (bench_points,
// medians of 7 and 9; bench_power, 2 s runs), fp16 and bf16: causal 4k +0.2 to +3.3%, 8k +1.2 to
// +2.8%, 16k +1.1 to +5.2%, windows of 2k-4k keys over 16k queries +1.4 to +3.2%; 2k -1.7 to
// +1.2% (docs/hopper.md, session 113); again in session 114, causal 4k-16k medians of 5: fp16
// +2.0 to +3.2%, bf16 -1.4 to +2.3%, sustained +1.7% at 8k and 16k. So on by default where rows
// see more than kD128PairMinKeys keys; FUSEDATTN_SM90_CAUSAL_PAIRS_128=0|1 turns them off, or on
// at any length.
// A (head, batch) of one query block leaves the pair's second CTA without a tile throughout: H100
// fp16, 128 queries over 8192 keys, 4 x 32 heads, TFLOP/s paired / unpaired, d256 185.3 / 189.9,
// d128 169.9 / 180.8; three query blocks 286.5 / 279.1 and 255.3 / 250.7; five (d256, 16k keys)
// 261.0 / 258.4 (session 113). So masked pairs need kMaskedPairMinBlocks.
constexpr int64_t kMaskedPairMinBlocks = kPairCluster;
// d128 pairs run where rows see more than this many keys: at 2048 they read even (above).
constexpr int64_t kD128PairMinKeys = 2048;
// Every paired head dim pairs masked launches on its own tile (gen_instances.py, MASKED_PAIRED).
constexpr bool has_masked_pair_cluster(int instance_head_dim, int block_n) {
  return has_pair_cluster(instance_head_dim) && block_n == tile_shape(instance_head_dim).block_n;
}
inline bool pairs_masked(const FwdParams& p, int instance_head_dim, const TiledRows& rows, TileShape shape) {
  if (!has_masked_pair_cluster(instance_head_dim, shape.block_n) || loads_unwritten_rows(p) ||
      rows.blocks(shape.block_m) < kMaskedPairMinBlocks || !env_switch_or("FUSEDATTN_SM90_CAUSAL_PAIRS", true))
    return false;
  return instance_head_dim != 128 ||
         env_switch_or("FUSEDATTN_SM90_CAUSAL_PAIRS_128", keys_per_row(p) > kD128PairMinKeys);
}
inline bool uses_pair_cluster(const FwdParams& p, MaskKind mask, int instance_head_dim, const TiledRows& rows,
                              TileShape shape) {
  if (!has_pair_cluster(instance_head_dim) || (mask != MaskKind::kFull && mask != MaskKind::kWindow) ||
      p.cu_seqlens_q != nullptr || shape.ctas_per_sm != 1 || shape.consumer_warpgroups != 2)
    return false;
  if (mask == MaskKind::kWindow) return pairs_masked(p, instance_head_dim, rows, shape);
  if (const std::optional<bool> forced = env_switch("FUSEDATTN_SM90_CLUSTER")) return *forced;
  const int64_t m_blocks = rows.blocks(shape.block_m);
  return pairs_by_default(instance_head_dim) && p.seqlen_k >= kPairClusterMinKeys &&
         (m_blocks % kPairCluster == 0 || m_blocks >= kPairClusterMinOddBlocks);
}

// The quad mix (fwd_launch.cuh, launch_quad_mix): a d256 pair launch's work split between clusters
// of four CTAs on the 64-key tile (kQuadCluster: a quarter of the K/V reads out of the L2 per CTA;
// of eight where they fit, mix_cluster_ctas) and, on a second stream at the same time, pairs on the
// SMs no quad fits (the H200 fits 30 quads, 120 of its 132 SMs: the GPCs' SM counts leave 12
// without one). Alone, the quads lost to the pairs for those 12 SMs (docs/hopper.md, session 70);
// beside the pairs they gain. H200, FA grid shapes, medians of 7 (5 at 16k) in one process, TFLOP/s
// pairs / mix: fp16 full 2k 653.7 / 671.3, 4k 677.4 / 698.5, 8k (the pairs on their 80-key tile)
// 692.0 / 731.7, 16k 702.0 / 747.2; bf16 2k 678.0 / 681.4 (noise), 4k 714.4 / 733.8, 8k 737.2 /
// 757.0, 16k 741.6 / 777.0; 1k (not paired by default) forced, fp16 594.0 unpaired / 589.4, bf16
// 623.4 / 606.2 (docs/hopper.md, session 81). So wherever d256's full-mask pairs run (the 64-key
// tile at any length, unless FUSEDATTN_SM90_D256_TILE=80 forces the other), where each (head,
// batch) has its query blocks in fours. FUSEDATTN_SM90_QUAD_MIX=0 keeps the pairs alone.
constexpr bool has_quad_mix(int instance_head_dim) { return instance_head_dim == 256; }
// The mix's cluster size for `blocks` query blocks a (head, batch): clusters of eight
// (kOctetCluster: an eighth of the K/V reads out of the L2 per CTA) where the blocks come in
// eights, else of four. FUSEDATTN_SM90_MIX_CLUSTER=4 keeps the quads. Two H100s, d256 full fp16
// 2k/4k/16k, octets / quads in one process: back to back for 2 s (at the power cap) +0.8% to +1.8%
// in all nine readings, with 0.6-2.0% fewer joules per FLOP; do_bench (medians of 9) +0.1% to
// +3.6% on one machine, -1.6% to +1.9% on the other; behind a copy kernel -1.9% to +0.8% in time
// (docs/hopper.md, session 109). On the H200, do_bench alone read them even (session 84).
inline int mix_cluster_ctas(int64_t blocks) {
  const char* v = std::getenv("FUSEDATTN_SM90_MIX_CLUSTER");
  const bool quads_forced = v != nullptr && std::atoi(v) == kQuadCluster;
  return blocks % kOctetCluster == 0 && !quads_forced ? kOctetCluster : kQuadCluster;
}
inline bool uses_quad_mix(const FwdParams& p, MaskKind mask, int instance_head_dim, const TiledRows& rows) {
  // Full masks only: the mix's clusters are compiled for them, and a masked launch's tile follows
  // the keys its rows see (masked pairs on the 64-key tile, branch exp/pairs64-run, once pulled
  // causal launches with query blocks in fours onto that tile here).
  if (mask != MaskKind::kFull || !has_quad_mix(instance_head_dim) || forced_block64(instance_head_dim) == false ||
      !env_switch_or("FUSEDATTN_SM90_QUAD_MIX", true))
    return false;
  const TileShape shape = block64_tile(instance_head_dim);
  return uses_pair_cluster(p, mask, instance_head_dim, rows, shape) && rows.blocks(shape.block_m) % kQuadCluster == 0;
}
// The cluster size of the mix p runs (launch_quad_mix), or 0 where it runs none. Only dispatch
// and planned_fwd_work ask for the size; the other callers need only uses_quad_mix.
inline int quad_mix_ctas(const FwdParams& p, MaskKind mask, int instance_head_dim, const TiledRows& rows) {
  if (!uses_quad_mix(p, mask, instance_head_dim, rows)) return 0;
  return mix_cluster_ctas(rows.blocks(block64_tile(instance_head_dim).block_m));
}

// A quad round's time as a percent of a pair round's, for QuadMixShares: even, as measured alone
// (session 70's quads on 120 SMs against the pairs on 132 put a quad round at 91-95% of a pair
// round, but beside each other the two launches share the L2 and the power). At the FA grid's
// d256 full points every percent from 70 to 130 picks the same shares.
// FUSEDATTN_SM90_QUAD_ROUND_PERCENT (1-1000) sets it for measurements.
constexpr int64_t kQuadRoundPercent = 100;
inline int64_t quad_round_percent() {
  const char* v = std::getenv("FUSEDATTN_SM90_QUAD_ROUND_PERCENT");
  const int64_t forced = v ? std::atoll(v) : 0;
  return forced >= 1 && forced <= 1000 ? forced : kQuadRoundPercent;
}

// The quad mix's share of `pairs` work items (pairs of query blocks) for quad_clusters clusters of
// four beside pair_clusters pairs: the quads take the first quad_items() quad items (two pair items
// each, the same four query blocks; pairs_per_cluster = 4 for clusters of eight), the pairs the
// rest from pair item pair_begin(quad_items()) (the launcher computes quad_items() once). Every
// item runs whole under the static schedule, so each launch takes whole rounds, and a quad round
// takes quad_round_percent of a pair round's time. The share is the one whose later launch ends
// first; of equal ends, the one whose two launches' rounds add up to least. The quads' k rounds
// hold at most k * quad_clusters items, and every item more the quads take is pairs_per_cluster
// fewer for the pairs, so only those counts are candidates. Against session 81's share in
// proportion to the clusters (which ends both launches after about as many rounds, the quads' last
// one part empty), H200, one process, TFLOP/s this / proportional, medians of 7: fp16 d256 full 4k
// 727.4 / 715.9, 8k 755.3 / 738.0; bf16 2k 711.7 / 700.2, 4k 751.5 / 734.3, 8k 764.6 / 755.3;
// medians of 21: fp16 2k 690.3 / 683.6, 16k 745.2 / 754.5, bf16 2k 704.8 / 704.4, 16k 774.1 / 777.0
// (docs/hopper.md, session 82). Every point of that grid has 512 pairs (16k tokens): 240 quad items
// (8 rounds) and 32 pair items (6 rounds) here, 232 (8 rounds, the last with 22 of the 30 quads)
// and 48 (8 rounds) proportionally. So the same shares read +1.2-2.3% at 4k and 8k, +0.1-1.6% at 2k
// and -0.4-1.2% at 16k, which no cost per round (kQuadRoundPercent) explains.
struct QuadMixShares {
  int64_t pairs, quad_clusters, pair_clusters;
  int64_t quad_round_percent;
  int64_t pairs_per_cluster = kQuadCluster / kPairCluster;
  static constexpr int64_t kPairRoundPercent = 100;
  constexpr int64_t quad_items() const {
    const int64_t most = pairs / pairs_per_cluster;
    int64_t best = 0, best_end = 0, best_sum = 0;
    for (int64_t rounds = 0; rounds == 0 || (rounds - 1) * quad_clusters < most; ++rounds) {
      const int64_t items = std::min(rounds * quad_clusters, most);
      const int64_t pair_rounds = ceil_div(pairs - pairs_per_cluster * items, pair_clusters);
      const int64_t quad_time = rounds * quad_round_percent, pair_time = pair_rounds * kPairRoundPercent;
      const int64_t end = std::max(quad_time, pair_time), sum = quad_time + pair_time;
      if (rounds == 0 || end < best_end || (end == best_end && sum < best_sum)) {
        best = items;
        best_end = end;
        best_sum = sum;
      }
    }
    return best;
  }
  constexpr int64_t pair_begin(int64_t quad_items) const { return pairs_per_cluster * quad_items; }
};

// Whether the instance for instance_head_dim (192 or 256) runs its 64-key tile for p's tiled rows
// under mask: by the keys a row sees (uses_block64), always for paged K/V, whose blocks must each
// lie in one page (pages are multiples of kCudaPageRows; the 112- and 80-key blocks do not divide
// it), and wherever the quad mix runs (its clusters of four or eight take the 64-key tile only).
inline bool runs_block64(int instance_head_dim, const FwdParams& p, MaskKind mask, const TiledRows& rows) {
  static_assert(kCudaPageRows % kD256Block64.block_n == 0 && kCudaPageRows % kD192Block64.block_n == 0,
                "a 64-key block lies in one page");
  return has_block64_tile(instance_head_dim) &&
         (p.block_table != nullptr || uses_block64(instance_head_dim, keys_per_row(p)) ||
          uses_quad_mix(p, mask, instance_head_dim, rows));
}

// Whether the K/V maps widen an L2 miss to one 128-byte line (L2Promotion::k128B) instead of two.
// Tiles of at most a warpgroup's rows (decode steps: a GQA group's few queries) read each K/V block
// once, at the memory's rate. There the 256-byte promotion costs a quarter more L2 sector lookups
// (the extra ones all hits, no extra DRAM bytes) and DRAM throughput: ncu on d128 decode, batch
// 16, 128k keys, fp16, H200: 88.7% of DRAM peak and 2.02 ms against 94.0% and 1.90 ms at 128
// bytes (cuDNN: 94.9%, 1.88 ms; docs/hopper.md, session 85). Taller tiles, whose K/V the L2 serves
// to many CTAs, keep 256 bytes (d128 prefill measured even). FUSEDATTN_SM90_KV_L2_128B=1 or 0
// forces the choice.
inline bool kv_l2_promotes_128b(const TiledRows& rows) {
  if (const std::optional<bool> forced = env_switch("FUSEDATTN_SM90_KV_L2_128B")) return *forced;
  return rows.rows <= kWarpgroupRows;
}

// The tile shape of the instance compiled for instance_head_dim (64, 128, 192 or 256) for p's
// tiled rows, before the choice of a cluster (fwd_tile_shape).
inline TileShape unpaired_tile_shape(int instance_head_dim, MaskKind mask, const TiledRows& rows, const FwdParams& p) {
  if (instance_head_dim == 64) {
    switch (d64_tile(mask, rows.rows, keys_per_row(p), loads_unwritten_rows(p))) {
      case D64Tile::kTall: return kD64Tall;
      case D64Tile::kPair: return kD64Pair;
      case D64Tile::kTable: break;
    }
  }
  if (runs_block64(instance_head_dim, p, mask, rows)) return block64_tile(instance_head_dim);
  return tile_shape(instance_head_dim);
}

// The tile shape a launch of p runs on the instance for instance_head_dim: the unpaired one, in
// a cluster of two where uses_pair_cluster says so.
inline TileShape fwd_tile_shape(const FwdParams& p, int instance_head_dim, MaskKind mask, const TiledRows& rows) {
  const TileShape shape = unpaired_tile_shape(instance_head_dim, mask, rows, p);
  return uses_pair_cluster(p, mask, instance_head_dim, rows, shape) ? paired(shape) : shape;
}

// Packed where that is estimated faster on the CTAs that run at once on sm_count SMs: first by
// the launch's waves times the tile height (the makespan of equal tiles), then by the rows
// computed in all (a tie
// there is a launch of fewer tiles than SMs, which the tail split spreads, so less work is less
// time). H200, fp16, TFLOP/s packed / unpacked: decode (one query, 32 query heads on 8 KV heads,
// d128) 3.4 / 3.1 at batch 1 and 4k keys, 13.1 / 7.2 at 128k, 16.8 / 7.1 at batch 16 and 128k;
// 16 queries, batch 4, 8k keys 170 / 106. By packed rows alone, d64 with 100 queries, group 8,
// batch 8 and 16 query heads would pack into 80 192-row tiles instead of 128 128-row ones
// (one wave either way on 132 SMs): 208 / 247. FUSEDATTN_SM90_PACK_GQA=0|1 turns it off, or on
// wherever the group allows. A variable-length batch is judged by its longest sequence (the
// tiles' bound, varlen_tile_bound).
inline TiledRows tiled_rows(const FwdParams& p, int instance_head_dim, MaskKind mask, int64_t sm_count) {
  const TiledRows unpacked = tiled_rows(p, 0);
  // Column masks never pack, even where forced: a tile's rows would be several query heads, whose
  // masks (column_mask_per_head) may differ, and the column walk reads one head's per tile.
  if (mask == MaskKind::kColumn) return unpacked;
  const int group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  if (group <= 1 || (group & (group - 1)) != 0 || kWarpgroupRows % group != 0) return unpacked;
  if (p.seqlen_q * group >= kMaxTiledRows) return unpacked;
  int shift = 0;
  while ((1 << shift) < group) ++shift;
  const TiledRows packed = tiled_rows(p, shift);
  if (const std::optional<bool> forced = env_switch("FUSEDATTN_SM90_PACK_GQA")) return *forced ? packed : unpacked;
  struct Cost {
    int64_t makespan, work;
  };
  const auto cost = [&](const TiledRows& r) {
    const TileShape shape = unpaired_tile_shape(instance_head_dim, mask, r, p);
    const int64_t block_m = shape.block_m, slots = sm_count * shape.ctas_per_sm;
    const int64_t tiles = r.blocks(shape.block_m) * r.heads * p.batch;
    return Cost{ceil_div(tiles, slots) * block_m, tiles * block_m};
  };
  const Cost u = cost(unpacked), k = cost(packed);
  const bool faster = k.makespan < u.makespan || (k.makespan == u.makespan && k.work < u.work);
  return faster ? packed : unpacked;
}

struct FwdWork {
  int64_t tiles = 0;   // query tiles (block_m tiled rows of one tile head and batch)
  int kv_blocks = 0;   // KV blocks of a full-mask tile: the steps the plan splits
  TailShares split;    // split.shares == 0: every item whole
  TiledRows rows{};
  TileShape shape{};   // the tile shape the launch runs
  // The cluster size of the mix the pairs' work is split with (quad_mix_ctas: four or eight), 0
  // where none (planned_fwd_work only): every item whole, whatever `split` plans for the pairs alone.
  int quad_mix_ctas = 0;
  int64_t items() const { return split.items(); }
  // Every item whole: the split's whole items and its tail items, uncut.
  void run_whole() { split = TailShares::unsplit(split.whole + split.tiles, kv_blocks); }
};

// The rows of the Q/O and K/V tensor maps per batch entry: the sequence lengths of a dense batch;
// a variable-length one is a single packed sequence to the TMA, of the rows the sequences use
// (so rows past them read as zeros, whatever the tensors hold there).
struct MapRows {
  int64_t q, k;
};
inline MapRows map_rows(const FwdParams& p) {
  if (p.cu_seqlens_q != nullptr) return {p.varlen_rows_q, p.varlen_rows_k};
  return {p.seqlen_q, p.seqlen_k};
}

// A bound on the tiles of a variable-length batch (the kernel counts them as it goes, see
// tile_scheduler.cuh): sequence b has ceil(tiled rows_b / block_m) query blocks per tile head, at
// most max_seqlen_q's and at most tiled rows_b / block_m + 1.
inline int64_t varlen_tile_bound(const FwdParams& p, const TiledRows& rows, int block_m) {
  const int64_t by_max = rows.blocks(block_m) * p.batch;
  const int64_t by_rows = ceil_div(rows.packing.rows(p.varlen_rows_q), block_m) + p.batch;
  return (by_max < by_rows ? by_max : by_rows) * rows.heads;
}

// The longest key range (in KV blocks) a variable-length launch splits: blocks x blocks < 2^31.
constexpr int kMaxVarlenSplitBlocks = 46340;

// The work list of a launch of tile shape `shape` on `slots` concurrently running CTAs (the
// persistent grid: one per SM), or clusters of them (shape.cluster_ctas > 1), whose work items
// are pairs of query blocks (tile_scheduler.cuh) and are split as tiles are. Only full masks
// split: their tiles are equal (a dense batch's), or (a variable-length one's) the plan models
// them by the longest sequence. A variable-length batch's tiles are counted only in the kernel,
// so its launch splits only where its bound fits one wave (decode: a few tiles over long
// caches), and then every tile: the split items follow the whole ones in the kernel's order,
// which the bound cannot place in the last wave.
inline FwdWork fwd_work(const FwdParams& p, MaskKind mask, int instance_head_dim, const TiledRows& rows,
                        TileShape shape, int64_t slots) {
  FwdWork w;
  w.rows = rows;
  w.shape = shape;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t m_blocks = rows.blocks(shape.block_m);
  w.tiles = varlen ? varlen_tile_bound(p, rows, shape.block_m) : m_blocks * rows.heads * p.batch;
  // A cluster's items: its query blocks in pairs per (head, batch), the last one of an odd count alone.
  const int64_t items =
      shape.cluster_ctas > 1 ? cluster_items(m_blocks, shape.cluster_ctas) * rows.heads * p.batch : w.tiles;
  w.kv_blocks = static_cast<int>(ceil_div(p.seqlen_k, shape.block_n));
  w.split = TailShares::unsplit(static_cast<int>(items), w.kv_blocks);
  if (mask != MaskKind::kFull || !tail_split_enabled() || (varlen && items >= slots)) return w;
  // A variable-length tile's parts are its steps scaled onto its own blocks in 32 bits
  // (tile_announcement.cuh): up to kMaxVarlenSplitBlocks blocks (2.9M keys of 64-key blocks).
  if (varlen && w.kv_blocks > kMaxVarlenSplitBlocks) return w;
  const int64_t tail = items % slots != 0 ? items % slots : std::min(items, slots);
  // Tiles of few rows (their combine spreads over the warpgroup, SplitCombine::spreads) below a wave.
  const bool few_rows = items < slots && combine_spreads(rows.rows, p.head_dim, instance_head_dim);
  // K and V of a tile: every KV block of every head dim column, in the instance's element size.
  const int64_t kv_bytes =
      2 * int64_t{w.kv_blocks} * shape.block_n * p.head_dim * static_cast<int64_t>(dtype_size(p.dtype));
  const FewRowsParts limits =
      few_rows ? few_rows_parts(items, slots, kv_bytes) : FewRowsParts{kTailMaxParts, kTailMinPartSteps};
  const int64_t forced = std::min<int64_t>(forced_tail_shares(), tail * w.kv_blocks);
  if (can_cut_tail(items, tail, w.kv_blocks, forced)) {
    // A forced cut too, as the plan's, leaves at most limits.max_parts parts a tile: the combine
    // keeps them in flight without a loop (split_combine.cuh, combine_spread_and_store).
    const TailShares cut = cut_tail(items, tail, w.kv_blocks, static_cast<int>(forced));
    if (cut.max_parts <= limits.max_parts) {
      w.split = cut;
      return w;
    }
  }
  w.split = plan_tail_shares(items, w.kv_blocks, slots, fwd_tail_cost(p.head_dim), limits.max_parts,
                             limits.min_part_steps);
  return w;
}

// What a launch of p on the instance for instance_head_dim plans on a GPU of sm_count SMs (the
// GPU tests check that the shapes they mean to split or pack do so).
// A cluster launch plans on the clusters that run at once, which the launcher asks the occupancy
// API for (fwd_launch.cuh, max_active_clusters); this assumes every SM holds one CTA of a pair,
// as on the H200 (66 pairs of 132 SMs).
inline FwdWork planned_fwd_work(const FwdParams& p, MaskKind mask, int instance_head_dim, int sm_count) {
  const TiledRows rows = tiled_rows(p, instance_head_dim, mask, sm_count);
  const TileShape shape = fwd_tile_shape(p, instance_head_dim, mask, rows);
  FwdWork w =
      fwd_work(p, mask, instance_head_dim, rows, shape, int64_t{sm_count} * shape.ctas_per_sm / shape.cluster_ctas);
  w.quad_mix_ctas = quad_mix_ctas(p, mask, instance_head_dim, rows);
  if (w.quad_mix_ctas != 0) w.run_whole();
  return w;
}

}  // namespace fusedattn::cuda::sm90
