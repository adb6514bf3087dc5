// The sm90 forward's GQA packing decision (src/cuda/sm90/fwd_split.h, tiled_rows): host arithmetic
// the launcher and the GPU tests share, checked here without a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm90/fwd_split.h"
#include "fusedattn/params.h"
#include "reference/problems.h"

namespace fusedattn::cuda::sm90 {
namespace {

constexpr int64_t kSms = 132;  // H100/H200

// The shape fields of a dense problem, as the launcher sees them.
FwdParams shape(int batch, int heads_q, int heads_kv, int64_t seqlen_q, int64_t seqlen_k) {
  FwdParams p;
  testing::set_shape(p, testing::dense(batch, heads_q, heads_kv, seqlen_q, seqlen_k, 128));
  return p;
}

// A decode step (one query per sequence, GQA 32/8): the group's 4 heads share a tile, at any batch.
TEST(GqaPack, DecodePacksTheGroup) {
  for (const int batch : {1, 16}) {
    const TiledRows r = tiled_rows(shape(batch, 32, 8, 1, 32768), 128, MaskKind::kFull, kSms);
    EXPECT_EQ(r.packing.shift, 2) << batch;
    EXPECT_EQ(r.rows, 4);
    EXPECT_EQ(r.heads, 8);
  }
  // Causal too, and the largest group a warpgroup slice holds (MQA with 64 query heads).
  EXPECT_EQ(tiled_rows(shape(2, 16, 2, 4, 1000), 128, MaskKind::kWindow, kSms).packing.shift, 3);
  EXPECT_EQ(tiled_rows(shape(1, 64, 1, 2, 513), 256, MaskKind::kFull, kSms).packing.shift, 6);
}

// Groups that cannot pack: none, not a power of two, larger than a warpgroup's 64 rows.
TEST(GqaPack, GroupsThatCannotPack) {
  EXPECT_EQ(tiled_rows(shape(1, 4, 4, 1, 300), 128, MaskKind::kFull, kSms).packing.shift, 0);
  EXPECT_EQ(tiled_rows(shape(1, 6, 2, 1, 300), 128, MaskKind::kFull, kSms).packing.shift, 0);
  EXPECT_EQ(tiled_rows(shape(1, 128, 1, 1, 300), 128, MaskKind::kFull, kSms).packing.shift, 0);
}

// Packing that would not shorten the launch: a long query sequence (as many equal tiles either
// way), and d64 with 100 queries of 16 heads in groups of 8 at batch 8, whose 800 tiled rows take
// the 192-row tile: 80 tiles of 192 rows against 128 of 128, one wave either way on 132 SMs
// (measured 208 vs 247 TFLOP/s packed). On 114 SMs the unpacked launch needs two waves: packed.
TEST(GqaPack, OnlyWhereTheLaunchShortens) {
  EXPECT_EQ(tiled_rows(shape(4, 32, 8, 4096, 4096), 128, MaskKind::kFull, kSms).packing.shift, 0);
  EXPECT_EQ(tiled_rows(shape(4, 32, 8, 4096, 4096), 128, MaskKind::kWindow, kSms).packing.shift, 0);
  EXPECT_EQ(tiled_rows(shape(8, 16, 2, 100, 2048), 64, MaskKind::kFull, kSms).packing.shift, 0);
  EXPECT_EQ(tiled_rows(shape(8, 16, 2, 100, 2048), 64, MaskKind::kFull, 114).packing.shift, 3);
  // Speculative decoding's few queries: 16 per sequence fill a 128-row tile with 8 heads' rows.
  EXPECT_EQ(tiled_rows(shape(4, 32, 8, 16, 8192), 128, MaskKind::kFull, kSms).packing.shift, 2);
}

// A variable-length batch: packed like a dense one of its longest sequence; its grid is planned
// from a bound on its tiles (the kernel counts them as it scans cu_seqlens), the smaller of
// max_seqlen_q's blocks per sequence and the tiled rows' blocks plus one per sequence, per tile
// head. Where that bound fits one wave (decode) every tile splits its keys into parts; a batch
// of more tiles never splits (the kernel's order cannot put the split tiles last).
TEST(GqaPack, VarlenPacksAndSplitsOnlyFewTiles) {
  static const int32_t kOffsets[2] = {0, 0};
  FwdParams p = shape(4, 32, 8, 1, 8192);  // decode: one query per sequence, groups of 4
  p.cu_seqlens_q = p.cu_seqlens_k = kOffsets;
  p.varlen_rows_q = 4;
  p.varlen_rows_k = 4 * 8192;
  const TiledRows packed = tiled_rows(p, 128, MaskKind::kFull, kSms);
  EXPECT_EQ(packed.packing.shift, 2);
  EXPECT_EQ(packed.rows, 4);
  EXPECT_EQ(packed.heads, 8);
  const FwdWork w = planned_fwd_work(p, MaskKind::kFull, 128, kSms);
  EXPECT_EQ(w.tiles, 4 * 8);  // one block of max_seqlen_q's 4 tiled rows per sequence and tile head
  EXPECT_EQ(w.split.whole, 0);
  EXPECT_TRUE(w.split.split());
  EXPECT_FALSE(planned_fwd_work(p, MaskKind::kWindow, 128, kSms).split.split());  // masked: whole tiles
  p.seqlen_q = 5000;            // long maximum, few rows: the rows' bound wins
  p.varlen_rows_q = 300;
  const TiledRows unpacked = tiled_rows(p, 0);
  EXPECT_EQ(varlen_tile_bound(p, unpacked, 128), ((300 + 127) / 128 + 4) * 32);
  EXPECT_EQ(varlen_tile_bound(p, tiled_rows(p, 2), 128), ((4 * 300 + 127) / 128 + 4) * 8);
  p.varlen_rows_q = 4 * 5000;   // rows of full sequences: the maximum's bound wins
  EXPECT_EQ(varlen_tile_bound(p, unpacked, 128), (5000 + 127) / 128 * 4 * 32);
  EXPECT_EQ(varlen_tile_bound(p, tiled_rows(p, 2), 128), (4 * 5000 + 127) / 128 * 4 * 8);
  EXPECT_FALSE(planned_fwd_work(p, MaskKind::kFull, 128, kSms).split.split());  // many tiles: whole
  // Decode over millions of keys: a dense batch splits (its parts are whole steps), a variable-length
  // one only up to kMaxVarlenSplitBlocks blocks (its parts are scaled in 32 bits).
  FwdParams longest = shape(1, 8, 8, 1, 6'000'000);
  EXPECT_TRUE(planned_fwd_work(longest, MaskKind::kFull, 128, kSms).split.split());
  longest.cu_seqlens_q = longest.cu_seqlens_k = kOffsets;
  longest.varlen_rows_q = 1;
  longest.varlen_rows_k = 6'000'000;
  EXPECT_FALSE(planned_fwd_work(longest, MaskKind::kFull, 128, kSms).split.split());
  longest.seqlen_k = longest.varlen_rows_k = 4'000'000;
  EXPECT_TRUE(planned_fwd_work(longest, MaskKind::kFull, 128, kSms).split.split());
}

}  // namespace
}  // namespace fusedattn::cuda::sm90
