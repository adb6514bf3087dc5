// Tile sizes of the sm80 backward kernel, one row per head dim, usable on host and device.
//
// Every warp owns kMmaRows (16) key rows of the CTA's KV block and keeps their dK and dV rows in
// fp32 registers for the whole query loop. With one warp per key-row block (d <= 128) each thread
// holds 2 * 16 * head_dim / 32 = head_dim accumulator registers and the scores stay in registers.
// Larger head dims split the output columns: either over col_warps warps that share the same key
// rows inside one CTA (each computes S^T and dP^T for its share of the query columns and hands
// P^T and dS^T to its partners through shared memory), or over col_split CTAs (each recomputes S
// and dP, 2 of the 5 matmuls, in exchange for half the accumulators).
#pragma once

#include "cuda/common/swizzle.cuh"
#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda::sm80 {

constexpr int kMmaRows = 16;  // M of mma.m16n8k16, rows per warp of every warp tile
constexpr int kMmaCols = 8;   // N of mma.m16n8k16
constexpr int kMmaK = 16;     // K of mma.m16n8k16
constexpr int kWarpSize = 32;

struct BwdTileConfig {
  int warps;      // 16 key rows each
  int block_m;    // query rows per iteration of the main loop
  int stages;     // Q/dO/lse/delta buffers: 2 = prefetch the next query block during compute
  int col_split;  // CTAs that share one KV block, each owning head_dim / col_split output columns
  int dq_warps_m;  // warps along the query rows of dQ = dS K (the rest split its columns)
  int col_warps;   // warps that share 16 key rows, each owning 1 / col_warps of the CTA's columns
  int dq_passes;   // column slices a warp computes its dQ tile in (fewer live registers)
};

// Shared memory (bytes) = 2 * block_n * pitch(D) * 2 (K, V) + stages * 2 * block_m * pitch(D) * 2
// (Q, dO) + block_n * pitch(block_m) * 2 (dS, and P when col_warps > 1) + stages * 2 * block_m * 4
// (lse2, delta); every row
// stays under the 163 KiB an sm80 CTA may use so the same table serves A100 and H100.
constexpr BwdTileConfig bwd_tile_config(int head_dim) {
  // d64: 128 query rows per iteration halve the per-iteration overhead (barriers, K/V fragment
  // reloads); measured +11% on H200 over 64 rows. d128 keeps 64: 128 would not fit the registers,
  // and 32 measured 10% slower.
  // dQ on a 4 x 2 warp grid (32 x D/2 warp tiles) reads 4 ldmatrix per 8 mma instead of the 5 of
  // an 8 x 1 grid (16 x D).
  // d256: 8 warps as 4 key-row blocks x 2 column halves in one CTA instead of two 4-warp CTAs
  // that each recompute S and dP: 1.4x fewer MMAs, Q/dO read once, two warps per scheduler.
  if (head_dim <= 64) return {8, 128, 2, 1, 4, 1, 1};   // 128 key rows: d64 130 KiB
  if (head_dim <= 128) return {8, 64, 2, 1, 4, 1, 1};  // 128 key rows: d128 144 KiB
  if (head_dim <= 192) return {4, 64, 2, 2, 4, 1, 1};  // 64 key rows, 96 columns per CTA: 152 KiB
  return {8, 64, 1, 1, 2, 2, 2};                       // d256: 64 key rows, 128 columns per warp: 145 KiB
}

template <int kHeadDim>
struct BwdTile {
  static constexpr BwdTileConfig kCfg = bwd_tile_config(kHeadDim);
  static constexpr int kWarps = kCfg.warps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kColWarps = kCfg.col_warps;
  static constexpr int kKeyWarps = kWarps / kColWarps;  // warps along the key rows
  static constexpr int kBlockN = kKeyWarps * kMmaRows;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kColSplit = kCfg.col_split;
  static constexpr int kOutDim = kHeadDim / kColSplit;  // dK/dV/dQ columns of one CTA
  static constexpr int kWarpOutDim = kOutDim / kColWarps;  // dK/dV columns of one warp
  static constexpr int kWarpQueries = kBlockM / kColWarps;  // S^T/dP^T columns of one warp
  // P^T and dS^T go through shared memory to the warps that share the key rows.
  static constexpr bool kScoresShared = kColWarps > 1;
  static constexpr int kPitch = swizzle_pitch(kHeadDim);  // elements per stored Q/K/V/dO row
  static constexpr int kDsPitch = swizzle_pitch(kBlockM);  // elements per stored dS^T row

  // dQ = dS K is split over a (kDqWarpsM x kDqWarpsN) warp grid of [kDqRows x kDqCols] tiles.
  static constexpr int kDqWarpsM = kCfg.dq_warps_m;
  static constexpr int kDqWarpsN = kWarps / kDqWarpsM;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqCols = kOutDim / kDqWarpsN;
  static constexpr int kDqPasses = kCfg.dq_passes;

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim >= 32 && kHeadDim <= 256, "head dim instances are 32..256, multiples of 16");
  static_assert(kHeadDim % kColSplit == 0 && kOutDim % (2 * kMmaCols) == 0,
                "output columns are loaded as pairs of n8 tiles");
  static_assert(kWarps % kColWarps == 0 && kOutDim % (2 * kMmaCols * kColWarps) == 0 &&
                    kBlockM % (2 * kMmaCols * kColWarps) == 0,
                "column warps split the output columns and the query columns into pairs of n8 tiles");
  static_assert(kColSplit <= kBwdMaxColSplit, "the workspace holds semaphores for at most two column halves");
  static_assert(kBlockM % (2 * kMmaCols) == 0 && kBlockM % kMmaK == 0, "query block is a whole number of k16 steps");
  static_assert(kBwdRowPad % kBlockM == 0, "query blocks must tile the workspace row padding (kBwdRowPad)");
  static_assert(kBlockM % kBwdSemRows == 0, "query blocks align with the dq semaphore granule");
  static_assert(kDqRows % kMmaRows == 0 && kDqCols % (2 * kMmaCols * kDqPasses) == 0 && kDqWarpsM * kDqWarpsN == kWarps,
                "the dQ warp grid must tile the [kBlockM x kOutDim] output");
  static_assert(kStages == 1 || kStages == 2, "one or two Q/dO buffers");
};

}  // namespace fusedattn::cuda::sm80
