// Tile sizes of the sm80 backward kernel, one row per head dim, usable on host and device.
//
// Every warp owns kMmaRows (16) key rows of the CTA's KV block and keeps their dK and dV rows in
// fp32 registers for the whole query loop, so kBlockN = 16 * warps and each thread holds
// 2 * 16 * out_dim / 32 = out_dim accumulator registers. Head dims above 128 would not fit
// next to S and dP, so they split the output columns over col_split CTAs (each recomputes S and
// dP, 2 of the 5 matmuls, in exchange for half the accumulators).
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
};

// Shared memory (bytes) = 2 * block_n * pitch(D) * 2 (K, V) + stages * 2 * block_m * pitch(D) * 2
// (Q, dO) + block_n * pitch(block_m) * 2 (dS) + stages * 2 * block_m * 4 (lse2, delta); every row
// stays under the 163 KiB an sm80 CTA may use so the same table serves A100 and H100.
constexpr BwdTileConfig bwd_tile_config(int head_dim) {
  // d64: 128 query rows per iteration halve the per-iteration overhead (barriers, K/V fragment
  // reloads); measured +11% on H200 over 64 rows. d128 keeps 64: 128 would not fit the registers,
  // and 32 measured 10% slower.
  // dQ on a 4 x 2 warp grid (32 x D/2 warp tiles) reads 4 ldmatrix per 8 mma instead of the 5 of
  // an 8 x 1 grid (16 x D).
  if (head_dim <= 64) return {8, 128, 2, 1, 4};   // 128 key rows: d64 130 KiB
  if (head_dim <= 128) return {8, 64, 2, 1, 4};  // 128 key rows: d128 144 KiB
  if (head_dim <= 192) return {4, 64, 2, 2, 4};  // 64 key rows, 96 columns per CTA: 152 KiB
  return {4, 64, 1, 2, 4};                       // d256: 64 key rows, 128 columns per CTA: 136 KiB
}

template <int kHeadDim>
struct BwdTile {
  static constexpr BwdTileConfig kCfg = bwd_tile_config(kHeadDim);
  static constexpr int kWarps = kCfg.warps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kBlockN = kWarps * kMmaRows;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kColSplit = kCfg.col_split;
  static constexpr int kOutDim = kHeadDim / kColSplit;  // dK/dV/dQ columns of one CTA
  static constexpr int kPitch = swizzle_pitch(kHeadDim);  // elements per stored Q/K/V/dO row
  static constexpr int kDsPitch = swizzle_pitch(kBlockM);  // elements per stored dS^T row

  // dQ = dS K is split over a (kDqWarpsM x kDqWarpsN) warp grid of [kDqRows x kDqCols] tiles.
  static constexpr int kDqWarpsM = kCfg.dq_warps_m;
  static constexpr int kDqWarpsN = kWarps / kDqWarpsM;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqCols = kOutDim / kDqWarpsN;

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim >= 32 && kHeadDim <= 256, "head dim instances are 32..256, multiples of 16");
  static_assert(kHeadDim % kColSplit == 0 && kOutDim % (2 * kMmaCols) == 0,
                "output columns are loaded as pairs of n8 tiles");
  static_assert(kColSplit <= kBwdMaxColSplit, "the workspace holds semaphores for at most two column halves");
  static_assert(kBlockM % (2 * kMmaCols) == 0 && kBlockM % kMmaK == 0, "query block is a whole number of k16 steps");
  static_assert(kBwdRowPad % kBlockM == 0, "query blocks must tile the workspace row padding (kBwdRowPad)");
  static_assert(kBlockM % kBwdSemRows == 0, "query blocks align with the dq semaphore granule");
  static_assert(kDqRows % kMmaRows == 0 && kDqCols % (2 * kMmaCols) == 0 && kDqWarpsM * kDqWarpsN == kWarps,
                "the dQ warp grid must tile the [kBlockM x kOutDim] output");
  static_assert(kStages == 1 || kStages == 2, "one or two Q/dO buffers");
};

}  // namespace fusedattn::cuda::sm80
