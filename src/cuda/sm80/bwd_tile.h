// Tile sizes of the sm80 backward kernel, one row per head dim, usable on host and device.
//
// Every warp owns key_tiles * 16 key rows of the CTA's KV block and keeps their dK and dV rows in
// fp32 registers for the whole query loop. With one warp per 16 key rows (d32-d96; d64 on
// A100-sized memory) each thread holds 2 * 16 * head_dim / 32 = head_dim accumulator registers and
// P^T/dS^T stay in registers as the dV/dK operands. Otherwise col_warps warps share key rows and
// split the output columns (each computes S^T and dP^T for its share of the query columns and
// hands P^T and dS^T to its partners through shared memory), which bounds the accumulators at 128
// registers.
#pragma once

#include "cuda/common/swizzle.cuh"
#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda::sm80 {

constexpr int kMmaRows = 16;  // M of mma.m16n8k16, rows per warp of every warp tile
constexpr int kMmaCols = 8;   // N of mma.m16n8k16
constexpr int kMmaK = 16;     // K of mma.m16n8k16
constexpr int kWarpSize = 32;

// The per-CTA opt-in shared-memory limits: sm80 (A100), which the default table fits so it
// serves every GPU, and sm90 (H100/H200), which the large-memory rows use where they differ.
constexpr int kSm80MaxSharedBytes = 163 * 1024;
constexpr int kSm90MaxSharedBytes = 227 * 1024;

struct BwdTileConfig {
  int warps;       // key-row warps x column warps
  int block_m;     // query rows per iteration of the main loop
  int stages;      // Q/dO/lse/delta buffers: 2 = prefetch the next query block during compute
  int dq_warps_m;  // warps along the query rows of dQ = dS K (the rest split its columns)
  int col_warps;   // warps that share key rows, each owning 1 / col_warps of the CTA's columns
  int dq_passes;   // column slices a warp computes its dQ tile in (fewer live registers)
  int key_tiles;   // 16-row key tiles per warp: every Q/dO fragment read from shared memory feeds
                   // key_tiles MMAs
  int query_slices;  // S^T/dP^T/dS^T of a warp computed in this many column slices, each consumed
                     // (dV, dK, dS^T hand-off) before the next: fewer live score registers
  bool warp_dq;      // every warp adds the dQ rows it computed itself, no CTA barrier before the
                     // adds (16-byte vector reductions on sm_90); else the CTA adds the whole tile
  bool dq_buffer;    // the fp32 dQ tile is staged in its own shared buffer instead of over the
                     // iteration's Q/dO: column warps then need no CTA barrier before staging it
  bool delta_in_dp = false;  // dP^T accumulators start at -delta (C-fragment quads in shared
                             // memory): the dS pass is one multiply per element
  bool stmatrix = false;     // P^T/dS^T go to shared memory with stmatrix on sm_90 (a quarter of
                             // the store instructions)
  bool kv_registers = false;  // each warp's K and V rows stay in registers as A fragments for the
                              // whole CTA: S^T = K Q^T and dP^T = V dO^T read only Q and dO from
                              // shared memory
  bool mask_range = false;  // with a window, the block mask test compares the query block with
                            // a per-CTA range of unmasked blocks (bwd_mask.h) instead of
                            // evaluating key_range in 64 bits every iteration
  bool xor_stage_address = false;  // the Q/dO operand reads take the swizzle XOR on their full
                                   // shared address, which changes with the stage every
                                   // iteration, instead of on loop-invariant per-lane offsets
                                   // that ptxas hoists out of the loop and spills (needs
                                   // stages == 2; bwd_warp_mma.cuh)
  bool dq_a_registers = false;  // dQ = dS K reads the warp's dS rows from shared memory once and
                                // keeps them in registers over the dQ column passes (instead of
                                // once per pass)
  constexpr bool operator==(const BwdTileConfig&) const = default;
};

// Shared memory (bytes) = 2 * block_n * pitch(D) * 2 (K, V) + stages * 2 * block_m * pitch(D) * 2
// (Q, dO) + block_n * pitch(block_m) * 2 (dS^T, and P^T with column warps) + stages * 2 * block_m * 4
// (lse2, delta; delta twice with delta_in_dp) [+ block_m * D * 4 with dq_buffer], block_n = 16 *
// key_tiles * warps / col_warps.
// Measurements: H200, fp16, FA grid.
constexpr BwdTileConfig bwd_tile_config(int head_dim, bool large_smem) {
  // d64: 128 query rows per iteration halve the per-iteration overhead (barriers, K/V fragment
  // reloads): +11% over 64 rows. dQ on a 4 x 2 warp grid (32 x 32 warp tiles). Column warps
  // with 32 key rows each measured the same speed, with 64 query rows 15% slower.
  // Two query slices and per-warp vector dQ adds: +4% (236 -> 246 TFLOP/s at 4k). Slices alone:
  // +1%, per-warp vector adds alone: +3%.
  // Where the memory allows, d64 takes the d128 layout (4 x 2 warps of 32 key rows x 64 query
  // columns) with its own dQ staging buffer: +2% at full 1k/4k/16k (253 -> 260 TFLOP/s at 4k),
  // -2% at causal 4k; without the buffer that layout lost 3%, with two query slices 2%.
  // -delta in the dP^T accumulators and stmatrix stores (large-memory row): +3% at full 2k/8k
  // (247 -> 254, 267 -> 275 TFLOP/s), +6% at causal 4k (230 -> 243); the same two at d128 lost 3%,
  // dQ added from the fragments (8-byte vector reductions, no staging) lost 4% at d64 and 8% at d128.
  // Each warp's K and V rows kept in registers as A fragments for the whole CTA (large-memory row:
  // S^T = K Q^T and dP^T = V dO^T read only Q and dO from shared memory, 16 fewer ldmatrix.x4 per
  // warp per iteration). H200, 2026-11-21, TFLOP/s before -> after (FA2 = torch SDPA FLASH):
  // full 1k 233.5 -> 238.1 (214.6), 4k 265.9 -> 273.1 (268.1), 8k 274.3 -> 281.9 (281.9),
  // 16k 277.8 -> 285.9 (288.3); causal 2k 216.3 -> 218.8 (199.3), 16k 273.2 -> 278.3 (274.2). bf16
  // alike (+2-3%). With two query slices (fewer live score registers) only about +1%. With the
  // 64 pinned fragment registers, dS^T is computed and stored one 16-column pair at a time (no
  // spill on sm_90, also from the compute_80 PTX; the whole slice at once spilled 12 bytes).
  // d32: two query slices and the dQ on an 8 x 1 grid (16 x 32 warp tiles: per-warp vector
  // adds): 177 -> 205 TFLOP/s at full 4k over the old row (the grid alone +9%, the slices alone
  // +1%), no spills (52 B before).
  if (head_dim <= 32) return {8, 128, 2, 8, 1, 1, 1, 2, true, false};                // 128 key rows
  if (head_dim <= 64 && large_smem) return {8, 128, 2, 4, 2, 1, 2, 1, true, true, true, true, true};  // 195 KiB
  if (head_dim <= 64) return {8, 128, 2, 4, 1, 1, 1, 2, true, false};               // 128 key rows: 130 KiB
  // d96 keeps the d64 layout with 64 query rows (not measured with column warps). Tile loads
  // walking its padded 128-element rows measured 205 TFLOP/s at full 4k against 227 for the plain
  // chunk order (one call; the round before: 224 vs 230); -delta in dP^T with stmatrix stores on
  // the padded walk: 220. Two query slices (32 score columns live at a time instead of 64) make
  // every d96 instance spill-free: the window instances spilled 16 bytes (sm_90) and 8 bytes
  // (sm_80) of per-CTA bookkeeping, one reload per iteration; the K and V fragments are read once
  // per slice (+12 ldmatrix per iteration, 140 -> 152). H200, 2026-11-21, fp16 TFLOP/s, one
  // call, two repetitions: one slice 227-228 (full 4k) / 205-206 (causal 4k); two slices 213-214
  // / 195-197 on the old tile-load order, 219 / 202 with the one-pointer order (bwd_tile_io.cuh,
  // which also took d192 causal 4k 182 -> 187). Kept for the spill-free kernels.
  if (head_dim <= 96) return {8, 64, 2, 4, 1, 1, 1, 2, false, false};  // 128 key rows: 144 KiB
  // d128: 4 x 2 warps of 32 key rows x 64 columns: a Q/dO fragment feeds two MMAs and P^T/dS^T
  // are read back once per column warp, 17% fewer shared-memory reads; +6% over 8 warps of
  // 16 key rows (253 vs 238 TFLOP/s at 4k). dQ on a 2 x 4 grid (32 x 32 warp tiles). Per-warp
  // vector dQ adds: +8% at 4k (254 -> 275); two query slices there lost 12%. Where the memory
  // allows, a dQ staging buffer of its own drops the CTA barrier before the staging: +1% at full
  // 4k, +3% at causal 4k (252 -> 259 TFLOP/s); dQ in two column passes there lost 6%.
  // The per-CTA mask range (mask_range) cuts the d128 window iteration by 48 of ~1120 instructions
  // (sm_90 SASS, unmeasured on GPU); on the d64 large, d96 and d256 rows ptxas spilled 4-52 bytes
  // more with it.
  // stmatrix stores of P^T/dS^T (a quarter of the store instructions into the MIO queue, which
  // ncu shows throttling this loop more than FA2's): +0.3-2% (H200, fp16, two calls of two
  // repetitions, TFLOP/s: causal 4k 278.6 -> 280.7, 8k 295.8 -> 298.9, 16k 305.4-307.8 -> 308.7
  // and 304.7-305.3 -> 310.8-311.2, full 16k 310.4 -> 312.1). Measured the same way and not
  // taken: -delta in dP^T (-1%), both (-3%), xor_stage_address (-1 to -2%), dQ from the fragments
  // (-7 to -10%), 16 warps of 16 key rows at 128 registers (-27%).
  if (head_dim <= 128 && large_smem) return {8, 64, 2, 2, 2, 1, 2, 1, true, true, false, true, false, true};  // 193 KiB
  // On the A100 row the Q/dO reads XOR their full stage address (xor_stage_address): sm_80 SASS
  // 8 -> 0 bytes of spill for 4-13 more static main-loop instructions (H200, this row forced:
  // full 4k 295 -> 288, causal 4k 271 -> 276 TFLOP/s, the sm_90 SASS of the row, not A100's); on
  // the d256 Hopper row's old 4 x 2 layout it only moved the spill (window 12 -> 20 bytes), on d96
  // sm_90 SASS spilled 52; the d256 Hopper row takes it since the twelfth session (below).
  if (head_dim <= 128) return {8, 64, 2, 2, 2, 1, 2, 1, true, false, false, false, false, true, true};  // 161 KiB
  // d192/d256: one 8-warp CTA with column warps instead of two 4-warp CTAs that each recompute S
  // and dP (1.4x fewer MMAs, Q/dO read once, two warps per scheduler): d256 1.9x at 2k (81 -> 158
  // TFLOP/s). dQ in column passes keeps the accumulators under the register limit.
  // The warps are 2 x 4 of 32 key rows x D/4 columns (was 4 x 2 of 16 key rows x D/2): a warp's
  // dV/dK MMAs read a 32 x 64 P^T/dS^T tile and 64 x D/4 of dO/Q instead of 16 x 64 and 64 x D/2,
  // a third fewer shared-memory reads for the same MMAs; with dQ in four passes every d256 instance
  // is spill-free (the old layout spilled 12-16 bytes, with two passes this one 28). H200, fp16,
  // one call, two repetitions each, TFLOP/s old -> new: d256 full 1k 191.7/190.3 -> 196.2/196.2,
  // 4k 214.1/214.0 -> 221.0/221.5, 16k 218.5/220.1 -> 226.3/226.1, causal 2k 188.8/190.1 ->
  // 191.0/191.0, 8k 215.4/217.1 -> 218.0/218.0 (FA2 201/247/259/189/241); the A100 row forced on
  // the H200 +2-3%; d192 (10 heads) full 1k 171.5/172.6 -> 178.5/178.5, 4k 193.6/194.7 ->
  // 202.0/202.0, causal 8k 196.4/197.7 -> 205.9/205.6. Measured alike on the 2 x 4 d256 Hopper row
  // (four dQ passes) and not taken: stmatrix stores (within 1%), -delta in dP^T (-1%).
  // stmatrix stores of P^T/dS^T as on the d128 row (sm_90 only; sm_80 SASS keeps 32-bit stores),
  // on d192's old layout: +1% (full 4k 192.7 -> 194.7, causal 16k 198.5 -> 200.9).
  // d192's dQ on a 4 x 2 grid of 16 rows x 96 columns, each warp adding its own rows by vector
  // reductions (warp_add_dq, a row per step) instead of the CTA adding the tile after a barrier
  // (the 2 x 4 grid's 48-column tiles are no whole 32-float segments); with -delta in dP^T it is
  // spill-free (without: 4 bytes in sm_80 SASS). H200, fp16, 10 heads, one call, two repetitions,
  // TFLOP/s before -> after: full 1k 178.3/178.3 -> 182.7/183.8, 4k 203.2/201.9 -> 202.9/204.5,
  // 16k 206.2/207.7 -> 210.4/210.4, causal 2k 176.7/177.5 -> 180.6/180.1, 8k 205.6/206.6 ->
  // 205.7/204.1 (FA2 198/245/257/198/256).
  if (head_dim <= 192) return {8, 64, 2, 4, 4, 2, 2, 1, true, false, true, true};  // 64 key rows: 161 KiB
  // d256 prefetches the next query block only where Hopper's shared memory allows it: +17% at 2k.
  // Per-warp vector dQ adds: +10% at causal 4k (173 -> 190 TFLOP/s, measured on the large tile).
  // ncu (H200, full 4k, against FA2's kernel of the same tiling) put this loop at 73% of the L1's
  // wavefronts with 14% more ldmatrix than FA2: each of the four dQ passes read the warp's dS rows
  // again. Hopper row: the dS fragments read once and kept over two passes (dq_a_registers), the
  // Q/dO reads XOR their full stage address (without it 12 bytes of those lane offsets spilled; with
  // four passes 8-16): 0 B. TFLOP/s, one call, two repetitions, four passes -> this: full 1k
  // 196.2/196.3 -> 203.9/203.9, 4k 219.1/219.2 -> 229.0/229.1, 16k 225.8/227.9 -> 238.0/238.2,
  // causal 2k 191.1/191.8 -> 201.1/200.6, 8k 217.9/219.5 -> 230.3/231.0; with -delta in dP^T as
  // well 1-2% less. The A100 row spilled 8-76 bytes with the fragments kept (sm_80 SASS).
  if (large_smem) return {8, 64, 2, 2, 4, 2, 2, 1, true, false, false, false, false, false, true, true};  // 64 key rows: 209 KiB
  return {8, 64, 1, 2, 4, 4, 2, 1, true, false};                  // 64 key rows: 145 KiB
}

// True when the head dim has a separate row for GPUs with sm90's shared memory.
constexpr bool bwd_has_large_smem_tile(int head_dim) {
  return !(bwd_tile_config(head_dim, true) == bwd_tile_config(head_dim, false));
}

template <int kHeadDim, bool kLargeSmem = false>
struct BwdTile {
  static constexpr BwdTileConfig kCfg = bwd_tile_config(kHeadDim, kLargeSmem);
  static constexpr int kWarps = kCfg.warps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kColWarps = kCfg.col_warps;
  static constexpr int kKeyWarps = kWarps / kColWarps;  // warps along the key rows
  static constexpr int kKeyTiles = kCfg.key_tiles;
  static constexpr int kWarpKeys = kKeyTiles * kMmaRows;  // key rows of one warp
  static constexpr int kBlockN = kKeyWarps * kWarpKeys;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kWarpOutDim = kHeadDim / kColWarps;  // dK/dV columns of one warp
  static constexpr int kWarpQueries = kBlockM / kColWarps;  // S^T/dP^T columns of one warp
  // P^T and dS^T go through shared memory to the warps that share the key rows.
  static constexpr bool kScoresShared = kColWarps > 1;
  static constexpr int kPitch = swizzle_pitch(kHeadDim);  // elements per stored Q/K/V/dO row
  static constexpr int kDsPitch = swizzle_pitch(kBlockM);  // elements per stored dS^T row

  // dQ = dS K is split over a (kDqWarpsM x kDqWarpsN) warp grid of [kDqRows x kDqCols] tiles.
  static constexpr int kDqWarpsM = kCfg.dq_warps_m;
  static constexpr int kDqWarpsN = kWarps / kDqWarpsM;
  static constexpr int kDqRows = kBlockM / kDqWarpsM;
  static constexpr int kDqCols = kHeadDim / kDqWarpsN;
  static constexpr int kDqPasses = kCfg.dq_passes;
  static constexpr int kQuerySlices = kCfg.query_slices;
  static constexpr int kSliceQueries = kWarpQueries / kQuerySlices;  // S^T columns computed and consumed at once
  static constexpr bool kWarpDq = kCfg.warp_dq;
  static constexpr bool kDqBuffer = kCfg.dq_buffer;
  static constexpr bool kDeltaInDp = kCfg.delta_in_dp;
  static constexpr bool kStmatrix = kCfg.stmatrix;
  static constexpr bool kKvRegisters = kCfg.kv_registers;
  static constexpr bool kMaskRange = kCfg.mask_range;
  static constexpr bool kXorStageAddress = kCfg.xor_stage_address;
  static constexpr bool kDqARegisters = kCfg.dq_a_registers;

  static_assert(kHeadDim % kMmaK == 0 && kHeadDim >= 32 && kHeadDim <= 256, "head dim instances are 32..256, multiples of 16");
  static_assert(kWarps % kColWarps == 0 && kHeadDim % (2 * kMmaCols * kColWarps) == 0 &&
                    kBlockM % (2 * kMmaCols * kColWarps) == 0,
                "column warps split the output columns and the query columns into pairs of n8 tiles");
  static_assert(kBlockM % (2 * kMmaCols) == 0 && kBlockM % kMmaK == 0, "query block is a whole number of k16 steps");
  static_assert(kBwdRowPad % kBlockM == 0, "query blocks must tile the workspace row padding (kBwdRowPad)");
  static_assert(kBlockM % kBwdSemRows == 0, "query blocks align with the dq semaphore granule");
  static_assert(kDqRows % kMmaRows == 0 && kDqCols % (2 * kMmaCols * kDqPasses) == 0 && kDqWarpsM * kDqWarpsN == kWarps,
                "the dQ warp grid must tile the [kBlockM x kHeadDim] output");
  static_assert(kStages == 1 || kStages == 2, "one or two Q/dO buffers");
  static_assert(kWarpQueries % kQuerySlices == 0 && kSliceQueries % kMmaK == 0, "slices are whole k16 steps of dV/dK");
  static_assert(!kWarpDq || kDqCols % kWarpSize == 0,
                "per-warp dQ adds need whole 32-float swizzle groups of the staged tile (warp_add_dq)");
  static_assert(kKeyTiles == 1 || kScoresShared, "scores kept in registers feed dV/dK one 16-row tile per warp");
  static_assert(!kXorStageAddress || kStages == 2, "with one stage the full address is loop-invariant itself");
};

}  // namespace fusedattn::cuda::sm80
