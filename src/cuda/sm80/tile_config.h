// Block sizes of the sm80 forward kernel, one row per head dim, usable on host and device. The
// launcher sizes shared memory from the same struct the kernel uses, and the static_asserts below
// reject a row that would not tile, not fit in shared memory or not keep its accumulators in
// registers.
#pragma once

#include "cuda/common/swizzle.cuh"

namespace fusedattn::cuda::sm80 {

constexpr int kWarpSize = 32;
constexpr int kMmaM = 16;  // mma.m16n8k16
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kElementBytes = 2;  // fp16 / bf16
// Opt-in shared memory per block on sm80 (A100: 163 KiB); Hopper allows more, but the portable
// kernel must also run on Ampere.
constexpr int kMaxSmemBytesSm80 = 163 * 1024;
// Accumulator registers one thread may hold at the peak (O, one key slice of S, the packed P of
// the earlier slices) and still fit in 255 registers with addresses, softmax statistics and
// fragments.
constexpr int kMaxAccumulatorRegs = 200;

struct FwdTile {
  int block_m;  // query rows per thread block
  int block_n;  // key rows per KV block
  int warps;    // each warp owns block_m / warps query rows (split-Q: no cross-warp softmax)
  // The KV block's keys are processed in this many slices, each through Q K^T, the softmax and
  // its packing to 16-bit P before the next slice's scores exist, so only one slice of S is held
  // in fp32 (the registers of the rest of S would push the O accumulator into local memory).
  int key_slices;
  int qk_unroll;  // k16 steps of Q K^T unrolled together (src/cuda/sm80/fwd_warp_mma.cuh)
  // Skip O's rescale when no row of the warp moved its max (OnlineSoftmax::rescale_o); the branch
  // around O's registers costs registers of its own, so only where they are not short.
  bool skip_unit_rescale;
  // The KV loop's order (src/cuda/sm80/fwd_kernel.cuh). pv_first: an iteration runs one block's
  // P V and then the next block's scores, so the first block's P V is the loop's code too (d128:
  // peeled, it spilled). Otherwise an iteration runs a block's scores and then its P V, and the
  // scheduler may overlap the last slice's softmax with the first slices' P V (d64: the exp2 of
  // slice 1 interleaved with the HMMAs of slice 0, which the loop's back edge would separate).
  bool pv_first;
  // Column masks (MaskKind::kColumn): a cut block's hidden scores are found by a call rather than
  // inline (common/column_mask.cuh, HiddenPairs::find with kByCall). Inline, d128's scores spilled 76-92 B;
  // with the search run by run beside the key loop, d32 and d96 spilled 16 / 4 B inline and none by
  // the calls, and d64 none inline (ptxas -v, sm_90).
  bool column_call;
};

// Chosen like FA2 for the same register budget: 128 query rows where the O accumulator still
// fits, otherwise 64; wide KV blocks for small head dims (fewer softmax passes per FLOP).
// d64 holds S of 128 keys next to O: two 64-key slices and Q K^T unrolled two k16 steps at a
// time keep it out of local memory (ptxas -v: 0 B spilled, was 56-72 B) at the same speed.
// d128 keeps one slice: its slices would reload the Q fragments per slice, which cost 1-7% on
// H200; with the rescale-skipping branch it spilled 92-160 B (sm_90, swizzled rows), without it
// it fits (ptxas -v: 0 B on sm_80 and sm_90 since the kernel's register diet, fwd_kernel.cuh). The
// spill-free d128 layouts measured were all slower on H200 (ours/FA2): 64x64 blocks three per SM
// 0.88-0.97, 64x128 in two key slices 0.86-0.93, 128 rows on 8 warps 0.71-0.75, against
// 0.97-1.03 for this tile. d64 on 64-row blocks (three per SM) won only causal 1k.
// pv_first where the rotated loop is needed (d128) and in the unmeasured one-slice rows (d32, d96,
// d192: their loop is the same code in either order). Scores first, against the rotated loop, in
// one call (H200, 2026-11-21, FUSEDATTN_DISABLE_SM90=1, fp16 TFLOP/s, two repetitions each): d64
// full 1k 289 -> 299, 4k 308 -> 318, causal 1k 231 -> 235, causal 4k 288-293 -> 282-287; d256
// full 4k 309-312 -> 318-319, causal 8k 305-308 -> 308; bf16 d64 full 4k 311 -> 321, d256 full 4k
// 320 -> 329.
constexpr FwdTile fwd_tile(int head_dim) {
  switch (head_dim) {
    case 32: return {128, 128, 4, 1, 2, true, true, true};
    case 64: return {128, 128, 4, 2, 2, true, false, false};
    case 96: return {128, 64, 4, 1, 6, true, true, true};
    case 128: return {128, 64, 4, 1, 8, false, true, true};
    case 192: return {64, 64, 4, 1, 12, true, true, false};
    default: return {64, 64, 4, 1, 16, true, false, false};  // 256
  }
}

// Elements per shared-memory row: a power of two of at least 64 elements (the swizzle's unit), so
// the chunk slots of a row divide the thread count (src/cuda/sm80/fwd_tile_io.cuh). d96 and d192
// rows are padded; the padding is never loaded or read.
constexpr int smem_pitch(int head_dim) {
  int pitch = kSwizzlePitchMultiple;
  while (pitch < head_dim) pitch *= 2;
  return pitch;
}

template <int kHeadDim>
struct FwdConfig {
  static constexpr FwdTile kTile = fwd_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / kMmaM;    // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / kMmaN;      // n8 tiles of S per warp
  static constexpr int kSlices = kTile.key_slices;
  static constexpr int kQkUnroll = kTile.qk_unroll;
  static constexpr bool kSkipUnitRescale = kTile.skip_unit_rescale;
  static constexpr bool kPvFirst = kTile.pv_first;
  static constexpr bool kColumnCall = kTile.column_call;
  static constexpr int kSliceN = kBlockN / kSlices;    // keys per slice
  static constexpr int kSliceNTiles = kSliceN / kMmaN;  // n8 tiles of one slice of S
  static constexpr int kDTiles = kHeadDim / kMmaN;     // n8 tiles of O per warp
  static constexpr int kPitch = smem_pitch(kHeadDim);  // elements per shared-memory row
  // Shared memory: Q (reused for O in the epilogue), one K and one V tile. K of block n-1 is
  // loaded while P*V of block n runs and V of block n while Q*K^T runs, which hides the loads
  // without a second buffer for either.
  static constexpr int kSmemQ = kBlockM * kPitch * kElementBytes;
  static constexpr int kSmemKV = kBlockN * kPitch * kElementBytes;
  static constexpr int kSmemBytes = kSmemQ + 2 * kSmemKV;
  // Registers allow two blocks per SM (2 x 128 threads x 255 registers fits the 64K file).
  static constexpr int kMinBlocksPerSm = 2;

  static_assert(kHeadDim % kMmaK == 0, "head dim must be a multiple of the mma k (16)");
  static_assert(kBlockM % (kWarps * kMmaM) == 0, "each warp must own whole m16 tiles");
  static_assert(kBlockN % kMmaK == 0, "P*V consumes keys 16 at a time");
  static_assert(kBlockN % kSlices == 0 && kSliceN % kMmaK == 0, "slices must be whole k16 steps of P*V");
  static_assert(kSliceNTiles % 2 == 0 && kDTiles % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
  static_assert(kSmemBytes <= kMaxSmemBytesSm80, "tiles exceed the sm80 shared-memory limit");
  // At the peak, while the last slice's scores are computed: O, that slice of S in fp32 and the
  // earlier slices' P packed two per register.
  static constexpr int kPeakAccumulatorRegs = kMTiles * 4 * (kDTiles + kSliceNTiles + (kNTiles - kSliceNTiles) / 2);
  static_assert(kPeakAccumulatorRegs <= kMaxAccumulatorRegs, "accumulators would spill");
};

}  // namespace fusedattn::cuda::sm80
