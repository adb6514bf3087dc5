// The sm90 forward's tile choice per launch (src/cuda/sm90/fwd_split.h: keys_per_row, d64_tile,
// uses_block64, uses_pair_cluster, fwd_tile_shape, runs_decode_tile): host rules the launcher and
// the GPU tests share, checked here without a GPU. The GPU tests force each shape on every kind of
// mask (Sm90Fwd.TileShapes, Sm90Fwd.D192BlockWidths, Sm90Fwd.D256BlockWidths); these pin which one
// a launch gets by default.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "cuda/sm90/fwd_split.h"
#include "fusedattn/attention.h"
#include "fusedattn/params.h"
#include "gpu/scoped_env.h"
#include "reference/problems.h"

namespace fusedattn::cuda::sm90 {
namespace {

// A dense problem of one sequence length (Sq = Sk) with the window folded the way the API folds
// it: causal is window_right = 0; -1 leaves a side unbounded.
FwdParams windowed(int64_t seqlen, int64_t left, int64_t right, int head_dim) {
  FwdParams p;
  testing::set_shape(p, testing::dense(2, 8, 8, seqlen, seqlen, head_dim));
  p.window_left = left;
  p.window_right = right;
  fold_unbounded_window(p);
  return p;
}

MaskKind mask_of(const FwdParams& p) { return p.is_masked() ? MaskKind::kWindow : MaskKind::kFull; }

TileShape chosen(const FwdParams& p, int instance_head_dim) {
  return fwd_tile_shape(p, instance_head_dim, mask_of(p), tiled_rows(p, 0));
}

bool same(TileShape a, TileShape b) {
  return a.block_m == b.block_m && a.block_n == b.block_n && a.stages == b.stages &&
         a.consumer_warpgroups == b.consumer_warpgroups && a.ctas_per_sm == b.ctas_per_sm;
}

TEST(Sm90TileChoice, KeysPerRowIsTheWindowWidthAtMostTheKeys) {
  EXPECT_EQ(keys_per_row(windowed(4096, -1, -1, 64)), 4096);   // full
  EXPECT_EQ(keys_per_row(windowed(4096, -1, 0, 64)), 4096);    // causal: the last row sees every key
  EXPECT_EQ(keys_per_row(windowed(4096, 512, 0, 64)), 513);    // sliding window
  EXPECT_EQ(keys_per_row(windowed(4096, 100, 50, 64)), 151);   // both sides
  EXPECT_EQ(keys_per_row(windowed(4096, 500, -1, 64)), 4096);  // left only: the right is unbounded
  EXPECT_EQ(keys_per_row(windowed(300, 1000, 0, 64)), 300);    // wider than the sequence
}

// Half the tile order's group for heads of at most four query tiles on the one-CTA d128/d256 tiles
// (session 28): causal 512 there, not 1k, not d64's pair tile.
TEST(Sm90TileChoice, ShortQueryHeadsTakeHalfAGroup) {
  const auto divisor = [](int64_t seqlen, int head_dim) {
    const FwdParams p = windowed(seqlen, -1, 0, head_dim);
    const TileShape shape = chosen(p, head_dim);
    return schedule_group_divisor(head_dim, shape, (seqlen + shape.block_m - 1) / shape.block_m);
  };
  EXPECT_EQ(divisor(512, 256), 2);
  EXPECT_EQ(divisor(512, 128), 2);
  EXPECT_EQ(divisor(300, 128), 2);
  EXPECT_EQ(divisor(1024, 256), 1);
  EXPECT_EQ(divisor(1024, 128), 1);
  EXPECT_EQ(divisor(512, 64), 1);  // the pair tile, two CTAs per SM
}

// The FA grid's choices (sessions 8-20): a window that covers the whole sequence changes nothing.
TEST(Sm90TileChoice, FullAndCausalKeepTheirTiles) {
  EXPECT_TRUE(same(chosen(windowed(256, -1, -1, 64), 64), tile_shape(64)));
  EXPECT_TRUE(same(chosen(windowed(512, -1, -1, 64), 64), kD64Tall));
  EXPECT_TRUE(same(chosen(windowed(16384, -1, -1, 64), 64), kD64Tall));
  EXPECT_TRUE(same(chosen(windowed(512, -1, 0, 64), 64), kD64Pair));
  EXPECT_TRUE(same(chosen(windowed(1024, -1, 0, 64), 64), kD64Pair));
  EXPECT_TRUE(same(chosen(windowed(2048, -1, 0, 64), 64), kD64Tall));
  EXPECT_TRUE(same(chosen(windowed(8192, -1, 0, 64), 64), kD64Tall));
  // d256: 64-key blocks up to 4096 keys per row, full masks included (session 25).
  EXPECT_TRUE(same(chosen(windowed(2048, -1, 0, 256), 256), kD256Block64));
  EXPECT_TRUE(same(chosen(windowed(4096, -1, 0, 256), 256), kD256Block64));
  EXPECT_TRUE(same(chosen(windowed(4097, -1, 0, 256), 256), tile_shape(256)));
  EXPECT_TRUE(same(chosen(windowed(1024, -1, -1, 256), 256), kD256Block64));
  EXPECT_TRUE(same(chosen(windowed(4096, -1, -1, 256), 256), kD256Block64));
  // Full masks beyond 4096 keys: the quad mix's 64-key tile where the query blocks come in fours
  // (uses_quad_mix; 64 here), the 80-key tile where they do not.
  EXPECT_TRUE(same(chosen(windowed(8192, -1, -1, 256), 256), kD256Block64));
  FwdParams six_blocks = windowed(8192, -1, -1, 256);
  six_blocks.seqlen_q = 6 * 128;
  EXPECT_TRUE(same(chosen(six_blocks, 256), tile_shape(256)));
  EXPECT_TRUE(same(chosen(windowed(1024, -1, 0, 128), 128), tile_shape(128)));
  // Few queries over many keys: the 128-row tile (long tiles), as before.
  FwdParams few = windowed(8192, -1, 0, 64);
  few.seqlen_q = 1000;
  EXPECT_TRUE(same(chosen(few, 64), tile_shape(64)));
}

// Sliding windows make every tile short at any length (session 21): d64 takes the pair tile up
// to 1024 keys per row, d256 64-key blocks up to 4096.
TEST(Sm90TileChoice, ShortWindowsTakeTheShortTileShapes) {
  for (const int64_t seqlen : {4096, 16384}) {
    EXPECT_TRUE(same(chosen(windowed(seqlen, 512, 0, 64), 64), kD64Pair)) << seqlen;
    EXPECT_TRUE(same(chosen(windowed(seqlen, 1023, 0, 64), 64), kD64Pair)) << seqlen;
    EXPECT_TRUE(same(chosen(windowed(seqlen, 256, 256, 64), 64), kD64Pair)) << seqlen;
    EXPECT_TRUE(same(chosen(windowed(seqlen, 2048, 0, 64), 64), kD64Tall)) << seqlen;
    EXPECT_TRUE(same(chosen(windowed(seqlen, 512, -1, 64), 64), kD64Tall)) << seqlen;
    EXPECT_TRUE(same(chosen(windowed(seqlen, 2048, 0, 256), 256), kD256Block64)) << seqlen;
    EXPECT_TRUE(same(chosen(windowed(seqlen, 4095, 0, 256), 256), kD256Block64)) << seqlen;  // 4096 keys
    // 4097 keys per row, or all 4096 of the shorter sequence.
    EXPECT_TRUE(same(chosen(windowed(seqlen, 4096, 0, 256), 256), seqlen > 4096 ? tile_shape(256) : kD256Block64))
        << seqlen;
  }
  // Few queries over a long cache with a short window: short tiles too.
  FwdParams few = windowed(32768, 512, 0, 64);
  few.seqlen_q = 16;
  EXPECT_TRUE(same(chosen(few, 64), kD64Pair));
}

// d192 (session 30): its own instance with 112-key blocks (one Q buffer, O staged in K/V), and
// 64-key blocks (two Q buffers) where rows see at most 4096 keys, by d256's rule; head dims in
// (128, 192] run on it instead of the 256 instance.
TEST(Sm90TileChoice, D192TakesItsOwnTiles) {
  EXPECT_EQ(tile_shape(192).block_n, 112);
  EXPECT_EQ(tile_shape(192).consumer_warpgroups, 2);
  EXPECT_TRUE(same(tile_shape(136), kD192));
  EXPECT_TRUE(same(tile_shape(200), tile_shape(256)));
  EXPECT_EQ(kD192Block64.block_n, 64);
  EXPECT_TRUE(same(chosen(windowed(512, -1, 0, 192), 192), kD192Block64));
  EXPECT_TRUE(same(chosen(windowed(4096, -1, -1, 192), 192), kD192Block64));
  EXPECT_TRUE(same(chosen(windowed(4097, -1, 0, 192), 192), kD192));
  EXPECT_TRUE(same(chosen(windowed(16384, -1, -1, 192), 192), kD192));
  EXPECT_TRUE(same(chosen(windowed(16384, 2048, 0, 192), 192), kD192Block64));
  // The one-CTA tiles' rules hold for it as for d128/d256.
  EXPECT_TRUE(prefers_static_schedule(windowed(2048, -1, -1, 192), MaskKind::kFull, 192));
  const TileShape short_causal = chosen(windowed(512, -1, 0, 192), 192);
  EXPECT_EQ(schedule_group_divisor(192, short_causal, 512 / short_causal.block_m), 2);
}

// FUSEDATTN_SM90_D192_TILE / _D256_TILE force either width of their instance against the
// keys-a-row rule; any other value (another instance's width included) leaves the rule.
TEST(Sm90TileChoice, BlockWidthSwitchesForceTheirInstanceOnly) {
  const FwdParams long_rows = windowed(8192, -1, -1, 192), short_rows = windowed(1024, -1, -1, 192);
  const std::pair<int, const char*> instances[] = {{192, "FUSEDATTN_SM90_D192_TILE"}, {256, "FUSEDATTN_SM90_D256_TILE"}};
  for (const auto& [d, name] : instances) {
    SCOPED_TRACE(name);
    EXPECT_FALSE(uses_block64(d, keys_per_row(long_rows)));
    EXPECT_TRUE(uses_block64(d, keys_per_row(short_rows)));
    {
      const testing::ScopedEnv narrow(name, "64");
      EXPECT_TRUE(uses_block64(d, keys_per_row(long_rows)));
    }
    {
      const testing::ScopedEnv table(name, std::to_string(tile_shape(d).block_n).c_str());
      EXPECT_FALSE(uses_block64(d, keys_per_row(short_rows)));
    }
    for (const char* other : {"80", "112", "128", "x"}) {
      if (std::to_string(tile_shape(d).block_n) == other) continue;
      const testing::ScopedEnv ignored(name, other);
      EXPECT_TRUE(uses_block64(d, keys_per_row(short_rows)));
      EXPECT_FALSE(uses_block64(d, keys_per_row(long_rows)));
    }
  }
  // One instance's switch leaves the other's choice alone.
  const testing::ScopedEnv d192_narrow("FUSEDATTN_SM90_D192_TILE", "64");
  EXPECT_FALSE(uses_block64(256, keys_per_row(long_rows)));
}

// seqused_k: d64 launches take the 128-row tile, whose GEMM turns order the zeroing of a
// sequence's unused V rows (Consumer::clear_unused_v_rows), whatever the lengths, the mask or
// FUSEDATTN_SM90_D64_TILE would choose otherwise.
TEST(Sm90TileChoice, D64SequsedKTakesTheTableTile) {
  static const int32_t kUsed[2] = {100, 2000};
  for (const auto& [left, right] : {std::pair<int64_t, int64_t>{-1, -1}, {-1, 0}, {256, 0}}) {
    for (int64_t seqlen : {512, 1024, 4096}) {
      FwdParams p = windowed(seqlen, left, right, 64);
      const bool default_is_table = same(chosen(p, 64), tile_shape(64));
      p.seqused_k = kUsed;
      EXPECT_TRUE(same(chosen(p, 64), tile_shape(64))) << seqlen << " " << left << " " << right;
      if (!default_is_table) {
        const testing::ScopedEnv pair("FUSEDATTN_SM90_D64_TILE", "pair");
        EXPECT_TRUE(same(chosen(p, 64), tile_shape(64))) << "forced pair, " << seqlen;
      }
    }
  }
}

// Column masks: d64 launches take the pair tile at any length and under any window, the 128-row
// one where FUSEDATTN_SM90_D64_TILE=128, never the 192-row one (not even where forced); d128 keeps
// its table tile.
TEST(Sm90TileChoice, ColumnMasksTakeThePairTileAtD64) {
  const auto column_tile = [](const FwdParams& p, int head_dim) {
    return fwd_tile_shape(p, head_dim, MaskKind::kColumn, tiled_rows(p, head_dim, MaskKind::kColumn, 132));
  };
  for (const auto& [left, right] : {std::pair<int64_t, int64_t>{-1, -1}, {-1, 0}, {256, 0}}) {
    for (int64_t seqlen : {100, 2048, 16384}) {
      const FwdParams p = windowed(seqlen, left, right, 64);
      EXPECT_TRUE(same(column_tile(p, 64), kD64Pair)) << seqlen << " " << left << " " << right;
      for (const char* forced : {"192", "pair"}) {
        const testing::ScopedEnv env("FUSEDATTN_SM90_D64_TILE", forced);
        EXPECT_TRUE(same(column_tile(p, 64), kD64Pair)) << "forced " << forced << ", " << seqlen;
      }
      {
        const testing::ScopedEnv env("FUSEDATTN_SM90_D64_TILE", "128");
        EXPECT_TRUE(same(column_tile(p, 64), tile_shape(64))) << "forced 128, " << seqlen;
      }
      EXPECT_TRUE(same(column_tile(windowed(seqlen, left, right, 128), 128), tile_shape(128))) << seqlen;
    }
  }
}

// Paged K/V: every tile a paged launch runs has KV blocks that lie in one page (a multiple of
// kCudaPageRows rows): d192/d256 their 64-key tiles whatever the keys, d64 its 128-row tile (the
// zeroing of a page's rows past the keys needs its GEMM turns, as with seqused_k), d128 its table
// tile. The unpaged choice at the same lengths is left alone.
TEST(Sm90TileChoice, PagedLaunchesRunBlocksThatLieInOnePage) {
  static const int32_t kTable[1] = {0};
  for (const int d : {64, 96, 128, 192, 256}) {
    for (int64_t seqlen : {512, 4096, 16384}) {
      FwdParams p = windowed(seqlen, -1, -1, d);
      const int32_t offsets[2] = {0, static_cast<int32_t>(seqlen)};  // paged calls are variable-length
      p.cu_seqlens_q = p.cu_seqlens_k = offsets;
      const TileShape unpaged = chosen(p, d);
      p.block_table = kTable;
      p.page_size = kCudaPageRows;
      const TileShape shape = chosen(p, d);
      EXPECT_EQ(kCudaPageRows % shape.block_n, 0) << "d" << d << " " << seqlen;
      if (d == 64) EXPECT_TRUE(same(shape, tile_shape(64))) << seqlen;
      if (has_block64_tile(d)) EXPECT_TRUE(same(shape, block64_tile(d))) << "d" << d << " " << seqlen;
      p.block_table = nullptr;
      EXPECT_TRUE(same(chosen(p, d), unpaged)) << "d" << d << " " << seqlen;
    }
  }
}

// d96 (session 30) runs d128's tile and takes its static schedule, but keeps the full tile-order
// group for short query heads (session 31).
TEST(Sm90TileChoice, D96RunsTheD128Tile) {
  EXPECT_TRUE(same(tile_shape(96), tile_shape(128)));
  EXPECT_TRUE(same(chosen(windowed(2048, -1, 0, 96), 96), tile_shape(128)));
  EXPECT_TRUE(prefers_static_schedule(windowed(2048, -1, -1, 96), MaskKind::kFull, 96));
  const TileShape short_causal = chosen(windowed(512, -1, 0, 96), 96);
  EXPECT_EQ(schedule_group_divisor(96, short_causal, 512 / short_causal.block_m), 1);
  EXPECT_EQ(schedule_group_divisor(128, short_causal, 512 / short_causal.block_m), 2);
}

// Full masks of equal tiles at d128/d256 up to 4096 keys take the static schedule (session 25);
// d64, masks, longer keys and variable-length batches the dynamic one.
TEST(Sm90TileChoice, StaticScheduleForShortFullMasks) {
  EXPECT_TRUE(prefers_static_schedule(windowed(512, -1, -1, 128), MaskKind::kFull, 128));
  EXPECT_TRUE(prefers_static_schedule(windowed(4096, -1, -1, 256), MaskKind::kFull, 256));
  EXPECT_FALSE(prefers_static_schedule(windowed(4097, -1, -1, 256), MaskKind::kFull, 256));
  EXPECT_FALSE(prefers_static_schedule(windowed(2048, -1, -1, 64), MaskKind::kFull, 64));
  EXPECT_FALSE(prefers_static_schedule(windowed(2048, -1, 0, 128), MaskKind::kWindow, 128));
  FwdParams varlen = windowed(2048, -1, -1, 128);
  const int32_t offsets[2] = {0, 2048};
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = offsets;
  EXPECT_FALSE(prefers_static_schedule(varlen, MaskKind::kFull, 128));
}

// A dense full-mask problem, batch 2 and 8 heads.
FwdParams full(int64_t seqlen_q, int64_t seqlen_k, int head_dim) {
  FwdParams p;
  testing::set_shape(p, testing::dense(2, 8, 8, seqlen_q, seqlen_k, head_dim));
  fold_unbounded_window(p);
  return p;
}

int cluster_of(const FwdParams& p, int instance_head_dim) { return chosen(p, instance_head_dim).cluster_ctas; }

// CTA pairs (kPairCluster) by default for full masks of dense batches at d256 from
// kPairClusterMinKeys keys, where the query blocks pair up (an even count, or enough that an idle
// last CTA costs little); never for variable-length batches, d64, d128 or d192 (under masks d256's
// 80-key tile and d128 pair: MaskedPairsByDefaultOnD256sLongTile). By
// default d256 pairs its 64-key tile from kPairClusterMinKeys to 4096 keys (where 64-key blocks
// end) and above it where the quad mix runs (query blocks in fours), its 80-key tile elsewhere;
// forced, either at any length.
TEST(Sm90TileChoice, PairClustersForLongFullMasks) {
  EXPECT_EQ(chosen(full(6 * 128, 8192, 256), 256).block_n, tile_shape(256).block_n);
  EXPECT_EQ(cluster_of(full(6 * 128, 8192, 256), 256), 2);
  EXPECT_EQ(chosen(full(1024, 8192, 256), 256).block_n, kD256Block64.block_n);
  EXPECT_EQ(cluster_of(full(1024, 8192, 256), 256), 2);
  EXPECT_EQ(cluster_of(full(4096, kPairClusterMinKeys - 1, 256), 256), 1);
  EXPECT_EQ(cluster_of(full(4096, kPairClusterMinKeys, 256), 256), 2);
  EXPECT_EQ(chosen(full(4096, 4096, 256), 256).block_n, kD256Block64.block_n);
  EXPECT_EQ(cluster_of(full(2048, 2048, 256), 256), 2);  // the FA grid's 2k: paired 64-key tiles
  EXPECT_EQ(chosen(full(2048, 2048, 256), 256).block_n, kD256Block64.block_n);
  EXPECT_EQ(cluster_of(full(1024, 1024, 256), 256), 1);
  EXPECT_EQ(cluster_of(full(3 * 128, 8192, 256), 256), 1);  // three query blocks: one CTA of two idle
  EXPECT_EQ(cluster_of(full(kPairClusterMinOddBlocks * 128, 8192, 256), 256), 2);
  EXPECT_EQ(cluster_of(windowed(4096, -1, 0, 256), 256), 1);  // causal on the 64-key tile
  EXPECT_EQ(cluster_of(full(8192, 8192, 128), 128), 1);
  EXPECT_EQ(cluster_of(full(8192, 8192, 64), 64), 1);
  EXPECT_EQ(cluster_of(full(8192, 8192, 192), 192), 1);
  FwdParams varlen = full(8192, 8192, 256);
  const int32_t offsets[2] = {0, 8192};
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = offsets;
  EXPECT_EQ(cluster_of(varlen, 256), 1);
  const testing::ScopedEnv on("FUSEDATTN_SM90_CLUSTER", "1");
  EXPECT_EQ(chosen(full(4096, 4096, 256), 256).block_n, kD256Block64.block_n);
  EXPECT_EQ(cluster_of(full(4096, 4096, 256), 256), 2);
  EXPECT_EQ(cluster_of(full(8192, 8192, 128), 128), 2);
}

// Pairs under causal and window masks (pairs_masked): on by default on d256's 80-key tile (rows
// that see more than kBlock64MaxKeys keys) and at d128 where rows see more than kD128PairMinKeys,
// with dense K/V and at least two query blocks per (head, batch); FUSEDATTN_SM90_CAUSAL_PAIRS=0
// turns them all off, FUSEDATTN_SM90_CAUSAL_PAIRS_128 d128's alone.
TEST(Sm90TileChoice, MaskedPairsByDefaultOnD256sLongTile) {
  {
    const testing::ScopedEnv off("FUSEDATTN_SM90_CAUSAL_PAIRS", "0");
    EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 256), 256), 1);
  }
  EXPECT_EQ(chosen(windowed(8192, -1, 0, 256), 256).block_n, tile_shape(256).block_n);
  EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 256), 256), 2);
  EXPECT_EQ(cluster_of(windowed(8192, 6000, 0, 256), 256), 2);           // a sliding window
  EXPECT_EQ(cluster_of(windowed(4096, -1, 0, 256), 256), 1);             // the 64-key tile
  EXPECT_EQ(cluster_of(windowed(8192, 1000, 0, 256), 256), 1);           // short windows: 64-key too
  EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 192), 192), 1);
  FwdParams varlen = windowed(8192, -1, 0, 256);
  const int32_t offsets[2] = {0, 8192};
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = offsets;
  EXPECT_EQ(cluster_of(varlen, 256), 1);
  FwdParams used = windowed(8192, -1, 0, 256);
  const int32_t seqused[2] = {8192, 8000};
  used.seqused_k = seqused;
  EXPECT_EQ(cluster_of(used, 256), 1);
  // One query block per (head, batch) leaves a pair's second CTA idle: unpaired; two pair.
  const auto few_queries = [](int64_t seqlen_q, int head_dim) {
    FwdParams p;
    testing::set_shape(p, testing::dense(4, 32, 32, seqlen_q, 8192, head_dim));
    p.window_left = -1;
    p.window_right = 0;
    fold_unbounded_window(p);
    return p;
  };
  EXPECT_EQ(cluster_of(few_queries(128, 256), 256), 1);
  EXPECT_EQ(cluster_of(few_queries(129, 256), 256), 2);
  // d128's pairs: by default where rows see more than 2048 keys; FUSEDATTN_SM90_CAUSAL_PAIRS_128=0
  // turns them off, 1 on at any length; not with the pairs off.
  EXPECT_EQ(cluster_of(few_queries(300, 128), 128), 2);
  EXPECT_EQ(cluster_of(windowed(4096, -1, 0, 128), 128), 2);
  EXPECT_EQ(cluster_of(windowed(2048, -1, 0, 128), 128), 1);
  EXPECT_EQ(cluster_of(windowed(8192, 1000, 0, 128), 128), 1);  // a short window
  {
    const testing::ScopedEnv d128_off("FUSEDATTN_SM90_CAUSAL_PAIRS_128", "0");
    EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 128), 128), 1);
  }
  const testing::ScopedEnv d128_pairs("FUSEDATTN_SM90_CAUSAL_PAIRS_128", "1");
  EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 128), 128), 2);
  EXPECT_EQ(cluster_of(windowed(2048, 500, 0, 128), 128), 2);
  EXPECT_EQ(cluster_of(few_queries(300, 128), 128), 2);
  EXPECT_EQ(cluster_of(few_queries(128, 128), 128), 1);
  EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 192), 192), 1);
  const testing::ScopedEnv off("FUSEDATTN_SM90_CAUSAL_PAIRS", "0");
  EXPECT_EQ(cluster_of(windowed(8192, -1, 0, 128), 128), 1);
}

// The quad mix (uses_quad_mix): d256's full-mask pairs split with clusters of four where every
// (head, batch) has its query blocks in fours, on the 64-key tile at any length; planned with
// every item whole. FUSEDATTN_SM90_QUAD_MIX=0 and a forced 80-key tile keep the pairs alone.
TEST(Sm90TileChoice, QuadMixWhereQueryBlocksComeInFours) {
  const auto mix = [](const FwdParams& p, int instance_head_dim) {
    return uses_quad_mix(p, mask_of(p), instance_head_dim, tiled_rows(p, 0));
  };
  EXPECT_TRUE(mix(full(2048, 2048, 256), 256));  // the FA grid's 2k: 16 query blocks
  EXPECT_TRUE(mix(full(1024, 16384, 256), 256));
  EXPECT_EQ(chosen(full(1024, 16384, 256), 256).block_n, kD256Block64.block_n);
  EXPECT_FALSE(mix(full(6 * 128, 8192, 256), 256));  // pairs, but not in fours
  EXPECT_FALSE(mix(full(1024, 1024, 256), 256));     // no pairs
  EXPECT_FALSE(mix(windowed(8192, -1, 0, 256), 256));
  EXPECT_FALSE(mix(full(8192, 8192, 128), 128));
  FwdParams varlen = full(8192, 8192, 256);
  const int32_t offsets[2] = {0, 8192};
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = offsets;
  EXPECT_FALSE(mix(varlen, 256));
  const FwdWork w = planned_fwd_work(full(4096, 4096, 256), MaskKind::kFull, 256, 132);
  EXPECT_EQ(w.quad_mix_ctas, kOctetCluster);  // 32 query blocks
  EXPECT_FALSE(w.split.split());
  {
    const testing::ScopedEnv off("FUSEDATTN_SM90_QUAD_MIX", "0");
    EXPECT_FALSE(mix(full(2048, 2048, 256), 256));
    EXPECT_EQ(chosen(full(1024, 8192, 256), 256).block_n, tile_shape(256).block_n);
  }
  {
    const testing::ScopedEnv wide("FUSEDATTN_SM90_D256_TILE", "80");
    EXPECT_FALSE(mix(full(2048, 2048, 256), 256));
  }
  {
    // Clusters of eight (mix_cluster_ctas) where the query blocks come in eights, else of four;
    // FUSEDATTN_SM90_MIX_CLUSTER=4 keeps the quads, any other value the default.
    const auto ctas = [](const FwdParams& p) { return quad_mix_ctas(p, mask_of(p), 256, tiled_rows(p, 0)); };
    EXPECT_EQ(ctas(full(2048, 2048, 256)), kOctetCluster);   // 16 query blocks
    EXPECT_EQ(ctas(full(12 * 128, 8192, 256)), kQuadCluster);  // 12: in fours, not in eights
    EXPECT_EQ(ctas(full(6 * 128, 8192, 256)), 0);
    const testing::ScopedEnv quads("FUSEDATTN_SM90_MIX_CLUSTER", "4");
    EXPECT_EQ(ctas(full(2048, 2048, 256)), kQuadCluster);
    const testing::ScopedEnv other("FUSEDATTN_SM90_MIX_CLUSTER", "6");
    EXPECT_EQ(ctas(full(2048, 2048, 256)), kOctetCluster);
  }
  const testing::ScopedEnv forced("FUSEDATTN_SM90_CLUSTER", "1");
  EXPECT_TRUE(mix(full(512, 1000, 256), 256));
}

// The mix's shares of the pairs' items (QuadMixShares): the quads' quad items and the pairs' pair
// items cover the list once, and no other share ends the later launch sooner (each share's end by
// brute force: whole rounds of whole items, a quad round quad_round_percent of a pair round). The
// FA grid's d256 full points on the H200 (16k tokens: 512 pairs; 30 quads, 6 pairs): the quads take
// 240 quad items in 8 rounds, which leaves the pairs 32 (6 rounds) where session 81's proportional
// share (232) left them 48 (8 rounds) for the same 8 quad rounds.
TEST(Sm90TileChoice, QuadMixSharesEndTheLaterLaunchFirst) {
  EXPECT_EQ((QuadMixShares{512, 30, 6, 100}.quad_items()), 240);
  const QuadMixShares grid{512, 30, 6, 100};
  EXPECT_EQ(grid.pair_begin(grid.quad_items()), 480);
  // Clusters of eight (on the H200 15 of them, the quads' 120 SMs): four pair items an item.
  const QuadMixShares octets{512, 15, 6, 100, 4};
  EXPECT_EQ(octets.quad_items(), 120);
  EXPECT_EQ(octets.pair_begin(octets.quad_items()), 480);
  EXPECT_EQ((QuadMixShares{512, 30, 6, 70}.quad_items()), 240);  // the same from 70% to 130%
  EXPECT_EQ((QuadMixShares{512, 30, 6, 130}.quad_items()), 240);
  EXPECT_EQ((QuadMixShares{2, 30, 6, 100}.quad_items()), 0);  // one round either way: the tie keeps the first
  // The GPU mix tests' shape (Sm90Cluster.QuadMixMatchesReferenceAndUnpaired, GpuSanitizer.QuadMix,
  // Sm90Fwd.QuadMixCapturedOnAFreshStream): 62 heads of 4 query blocks, 124 pair items, give the
  // H200's quads two rounds and its pairs 4 items, so both launches run; 40 heads (80 items), their
  // shape before session 95, gave the quads all of them.
  EXPECT_EQ((QuadMixShares{124, 30, 6, 100}.quad_items()), 60);
  EXPECT_EQ((QuadMixShares{80, 30, 6, 100}.quad_items()), 40);
  for (const int64_t pairs : {1, 2, 4, 10, 64, 511, 512, 1000, 4096})
    for (const auto& clusters : {std::pair<int64_t, int64_t>{30, 6}, {1, 1}, {26, 5}, {15, 2}})
      for (const int64_t percent : {50, 90, 100, 120, 300}) {
        // Named copies, not structured bindings: clang 14 lets no lambda capture those.
        const int64_t quads = clusters.first, pair_clusters = clusters.second;
        const QuadMixShares s{pairs, quads, pair_clusters, percent};
        SCOPED_TRACE(std::to_string(pairs) + " pairs, " + std::to_string(quads) + " quads, " +
                     std::to_string(pair_clusters) + " pairs' clusters, " + std::to_string(percent) + "%");
        const auto end = [&](int64_t quad_items) {
          const int64_t quad_rounds = (quad_items + quads - 1) / quads;
          const int64_t pair_rounds = (pairs - 2 * quad_items + pair_clusters - 1) / pair_clusters;
          return std::max(quad_rounds * percent, pair_rounds * 100);
        };
        ASSERT_GE(s.quad_items(), 0);
        ASSERT_EQ(s.pair_begin(s.quad_items()), 2 * s.quad_items());
        ASSERT_LE(s.pair_begin(s.quad_items()), pairs);
        for (int64_t other = 0; 2 * other <= pairs; ++other) ASSERT_LE(end(s.quad_items()), end(other)) << other;
      }
}

// FUSEDATTN_SM90_CLUSTER=0 turns the pairs off; =1 on wherever they are supported, and only there.
TEST(Sm90TileChoice, ClusterSwitch) {
  {
    const testing::ScopedEnv off("FUSEDATTN_SM90_CLUSTER", "0");
    EXPECT_EQ(cluster_of(full(4096, 4096, 128), 128), 1);
  }
  const testing::ScopedEnv on("FUSEDATTN_SM90_CLUSTER", "1");
  EXPECT_EQ(cluster_of(full(300, 30, 256), 256), 2);
  EXPECT_EQ(cluster_of(windowed(4096, -1, 0, 256), 256), 1);
  EXPECT_EQ(cluster_of(full(4096, 4096, 64), 64), 1);
}

// The K/V maps promote L2 misses to 128 bytes for tiles of at most a warpgroup's rows (decode
// steps, packed GQA groups included), to 256 bytes otherwise; the switch forces either.
TEST(Sm90TileChoice, KvL2PromotionNarrowsForDecodeSteps) {
  constexpr int64_t kSms = 132;
  const auto rows_of = [](int64_t batch, int64_t seqlen_q, int64_t seqlen_k) {
    FwdParams p;
    testing::set_shape(p, testing::dense(batch, 32, 8, seqlen_q, seqlen_k, 128));
    return tiled_rows(p, 128, MaskKind::kFull, kSms);
  };
  const TiledRows decode = rows_of(16, 1, 131072), short_queries = rows_of(1, 16, 32768),
                  prefill = rows_of(2, 2048, 2048), just_over = rows_of(1, 65, 8192);
  EXPECT_EQ(decode.rows, 4);  // the GQA group's four heads, packed
  EXPECT_TRUE(kv_l2_promotes_128b(decode));
  EXPECT_TRUE(kv_l2_promotes_128b(short_queries));
  EXPECT_FALSE(kv_l2_promotes_128b(prefill));
  EXPECT_GT(just_over.rows, kWarpgroupRows);
  EXPECT_FALSE(kv_l2_promotes_128b(just_over));
  {
    const testing::ScopedEnv off("FUSEDATTN_SM90_KV_L2_128B", "0");
    EXPECT_FALSE(kv_l2_promotes_128b(decode));
  }
  const testing::ScopedEnv on("FUSEDATTN_SM90_KV_L2_128B", "1");
  EXPECT_TRUE(kv_l2_promotes_128b(prefill));
}

// Each warpgroup's O slice goes out as one TMA box where its tile stages it in shared memory of
// its own, for dense, unpacked rows whose head_dim fills the tile's slabs; else one box per slab.
TEST(Sm90TileChoice, OSliceAsOneBox) {
  const FwdParams p = full(2048, 2048, 256);
  EXPECT_TRUE(stores_o_as_one_box(p, true, 0, 256));
  EXPECT_FALSE(stores_o_as_one_box(p, false, 0, 256));  // staging shared by the warpgroups
  EXPECT_FALSE(stores_o_as_one_box(p, true, 2, 256));   // GQA-packed rows
  EXPECT_FALSE(stores_o_as_one_box(full(2048, 2048, 200), true, 0, 256));  // a part-filled last slab
  FwdParams varlen = p;
  const int32_t offsets[] = {0, 2048};
  varlen.cu_seqlens_q = offsets;
  EXPECT_FALSE(stores_o_as_one_box(varlen, true, 0, 256));
  const testing::ScopedEnv off("FUSEDATTN_SM90_O_ONE_BOX", "0");
  EXPECT_FALSE(stores_o_as_one_box(p, true, 0, 256));
}

// A paired launch's work items are its pairs of query blocks: 3 query blocks make 2 pairs per
// (head, batch). Their last wave is cut into shares as tiles are, planned on the clusters (one per
// two SMs): 2 x 8 (head, batch) of 8192 queries are 512 pairs of 103 80-key steps on 66 clusters
// (the pairs alone: the quad mix would run them whole on the 64-key tile).
TEST(Sm90TileChoice, PairedWorkIsPairsOfQueryBlocks) {
  const testing::ScopedEnv on("FUSEDATTN_SM90_CLUSTER", "1");
  const testing::ScopedEnv alone("FUSEDATTN_SM90_QUAD_MIX", "0");
  {
    const testing::ScopedEnv whole("FUSEDATTN_SM90_TAIL_SPLIT", "0");
    const FwdWork w = planned_fwd_work(full(3 * 128, 4096, 128), MaskKind::kFull, 128, 132);
    EXPECT_EQ(w.shape.cluster_ctas, 2);
    EXPECT_EQ(w.items(), 2 * 8 * 2);
    EXPECT_FALSE(w.split.split());
  }
  const FwdWork w = planned_fwd_work(full(8192, 8192, 256), MaskKind::kFull, 256, 132);
  ASSERT_EQ(w.shape.cluster_ctas, 2);
  ASSERT_EQ(w.kv_blocks, 103);
  const TailShares plan = plan_tail_shares(512, 103, 66, fwd_tail_cost(256));
  EXPECT_TRUE(w.split.split());
  EXPECT_EQ(w.split.whole + w.split.tiles, 512);
  EXPECT_EQ(w.split.whole, plan.whole);
  EXPECT_EQ(w.split.shares, plan.shares);
  EXPECT_EQ(w.split.max_parts, plan.max_parts);
  // Run whole (no workspace during a graph capture), the same 512 pairs.
  FwdWork undone = w;
  undone.run_whole();
  EXPECT_FALSE(undone.split.split());
  EXPECT_EQ(undone.items(), 512);
}

// FUSEDATTN_SM90_TAIL_SHARES forces a cut only where it leaves at most kTailMaxParts parts a tile
// (the combine keeps that many parts in flight, split_combine.cuh); a finer one is ignored. 16
// tiles of 9 steps (2 heads of 1024 queries against 1100 keys): 23 shares give 2-3 parts a tile,
// 144 would give 9.
TEST(Sm90TileChoice, ForcedSharesKeepAtMostTheMaxParts) {
  const testing::ScopedEnv unpaired("FUSEDATTN_SM90_CLUSTER", "0");
  FwdParams p;
  testing::set_shape(p, testing::dense(1, 2, 2, 1024, 1100, 128));
  const FwdWork planned = planned_fwd_work(p, MaskKind::kFull, 128, 132);
  ASSERT_EQ(planned.kv_blocks, 9);
  {
    const testing::ScopedEnv forced("FUSEDATTN_SM90_TAIL_SHARES", "23");
    const FwdWork w = planned_fwd_work(p, MaskKind::kFull, 128, 132);
    EXPECT_EQ(w.split.shares, 23);
    EXPECT_LE(w.split.max_parts, kTailMaxParts);
  }
  const testing::ScopedEnv too_fine("FUSEDATTN_SM90_TAIL_SHARES", "144");
  ASSERT_GT(cut_tail(16, 16, 9, 144).max_parts, kTailMaxParts);
  const FwdWork w = planned_fwd_work(p, MaskKind::kFull, 128, 132);
  EXPECT_EQ(w.split.shares, planned.split.shares);
  EXPECT_EQ(w.split.max_parts, planned.split.max_parts);
  EXPECT_LE(w.split.max_parts, kTailMaxParts);
}

// FUSEDATTN_SM90_FEW_ROWS_PARTS lets a decode step's tiles (fewer than the SMs, each combined
// spread over the warpgroup) take more than kTailMaxParts parts, up to kFewRowsMaxParts: 8 packed
// tiles of 4 rows over 32k keys (256 KV blocks) go from 8 parts each to 16. A decode whose tiles
// hold 24 rows at d256 (combined by their holders, a round trip per part) keeps its plan.
TEST(Sm90TileChoice, FewRowsPartsSwitchCutsDecodeTilesFiner) {
  FwdParams p;
  testing::set_shape(p, testing::dense(1, 32, 8, 1, 32768, 128));
  const FwdWork base = planned_fwd_work(p, MaskKind::kFull, 128, 132);
  ASSERT_TRUE(base.split.split());
  EXPECT_LE(base.split.max_parts, kTailMaxParts);
  FwdParams held;
  testing::set_shape(held, testing::dense(1, 8, 1, 3, 32768, 256));
  const FwdWork held_base = planned_fwd_work(held, MaskKind::kFull, 256, 132);
  const testing::ScopedEnv finer("FUSEDATTN_SM90_FEW_ROWS_PARTS", "32");
  const FwdWork w = planned_fwd_work(p, MaskKind::kFull, 128, 132);
  EXPECT_GT(w.split.max_parts, kTailMaxParts);
  EXPECT_LE(w.split.max_parts, kFewRowsMaxParts);
  EXPECT_GT(w.split.shares, base.split.shares);
  const FwdWork h = planned_fwd_work(held, MaskKind::kFull, 256, 132);
  EXPECT_EQ(h.split.shares, held_base.split.shares);
  EXPECT_EQ(h.split.max_parts, held_base.split.max_parts);
}

// Unforced, a decode step's tiles take more than kTailMaxParts parts only while each part keeps
// kFewRowsMinPartBytes of K and V and the parts fit one CTA a slot (fwd_split.h, few_rows_parts):
// 8 packed d128 tiles over 128k keys (64 MiB each) take 16 parts, 128 CTAs on 132 SMs; over 32k
// keys (16 MiB) and with 16 tiles over 128k (8 slots a tile) they keep at most kTailMaxParts.
TEST(Sm90TileChoice, DecodeTilesTakeMorePartsOnlyOnLongCaches) {
  const auto plan = [](int batch, int64_t keys) {
    FwdParams p;
    testing::set_shape(p, testing::dense(batch, 32, 8, 1, keys, 128));
    return planned_fwd_work(p, MaskKind::kFull, 128, 132);
  };
  const FwdWork long_cache = plan(1, 131072);
  ASSERT_TRUE(long_cache.split.split());
  EXPECT_EQ(long_cache.split.max_parts, 16);
  EXPECT_EQ(long_cache.split.shares, 8 * 16);
  EXPECT_GE(int64_t{long_cache.kv_blocks} * 128 * 128 * 2 * 2 / long_cache.split.max_parts, kFewRowsMinPartBytes);
  const FwdWork short_cache = plan(1, 32768);
  ASSERT_TRUE(short_cache.split.split());
  EXPECT_LE(short_cache.split.max_parts, kTailMaxParts);
  const FwdWork more_tiles = plan(2, 131072);
  EXPECT_LE(more_tiles.split.max_parts, kTailMaxParts);
}

// The plan's few-row rule is the kernel's (tile_config.h, combine_spreads). 5 query rows at head
// dim 200 come to one 8-column chunk a thread, but their 32 holders' float4 groups to 8 a thread,
// more than the d256 tile's spread combine takes (4): the kernel combines them by their holders,
// one round trip a part, so the plan keeps them to kTailMaxParts parts. 4 rows (16 holders, 4
// groups a thread) combine spread and take more parts over a long cache.
TEST(Sm90TileChoice, FewRowPlansFollowTheKernelsSpreadRule) {
  EXPECT_TRUE(combine_spreads(4, 200, 256));
  EXPECT_FALSE(combine_spreads(5, 200, 256));
  EXPECT_FALSE(combine_spreads(6, 160, 192));  // 32 holders of 24 groups: 6 a thread, above 4
  EXPECT_TRUE(combine_spreads(8, 128, 128));   // a GQA group of 8 at d128: 4 groups a thread
  EXPECT_FALSE(combine_spreads(9, 128, 128));  // more than one chunk a thread
  const auto plan = [](int64_t queries) {
    FwdParams p;
    testing::set_shape(p, testing::dense(1, 1, 1, queries, 131072, 200));
    return planned_fwd_work(p, MaskKind::kFull, 256, 132);
  };
  const FwdWork four = plan(4), five = plan(5);
  ASSERT_TRUE(four.split.split());
  ASSERT_TRUE(five.split.split());
  EXPECT_GT(four.split.max_parts, kTailMaxParts);
  EXPECT_LE(five.split.max_parts, kTailMaxParts);
}

// Decode steps (at most kDecodeTileRows tiled rows: the one-row slices') take the tile's decode
// kernel, which alone compiles the warp-split loop (tile_config.h, decode_tile); every other launch
// takes the kernel without it, whose prefill tiles ran ~1% faster (docs/hopper.md, session 103).
// Rows count after GQA packing (a variable-length batch's by its longest sequence, FwdParams::seqlen_q).
TEST(Sm90TileChoice, DecodeStepsTakeTheDecodeKernel) {
  const auto decodes = [](int64_t queries, int heads_q, int heads_kv) {
    FwdParams p;
    testing::set_shape(p, testing::dense(4, heads_q, heads_kv, queries, 8192, 128));
    return runs_decode_tile(tiled_rows(p, 128, MaskKind::kFull, 132));
  };
  EXPECT_TRUE(decodes(1, 32, 8));    // a packed group of 4
  EXPECT_TRUE(decodes(1, 64, 8));    // a packed group of 8
  EXPECT_TRUE(decodes(2, 32, 8));    // 2 positions x 4 heads
  EXPECT_FALSE(decodes(3, 32, 8));   // 12 tiled rows
  EXPECT_FALSE(decodes(2, 64, 8));   // 16 tiled rows
  EXPECT_TRUE(decodes(1, 8, 8));     // one query, no GQA
  EXPECT_TRUE(decodes(8, 8, 8));
  EXPECT_FALSE(decodes(9, 8, 8));
  EXPECT_FALSE(decodes(2048, 16, 16));  // prefill
  EXPECT_EQ(kDecodeTileRows, 8);
  EXPECT_TRUE(decode_tile(tile_shape(128)).decode);
  EXPECT_FALSE(tile_shape(128).decode);
  EXPECT_TRUE(same(decode_tile(tile_shape(128)), tile_shape(128)));  // the same tile otherwise
}

}  // namespace
}  // namespace fusedattn::cuda::sm90
