// Column-sparse masks (FwdParams::column_mask, MaskKind::kColumn) in the Hopper forward, on top
// of the window (or causal, or no) mask that TileMask applies. The mask's per-key-block summary
// (common/column_summary.h) is written over the tile's kBlockN keys before the kernel; from it
// - the producer warp walks a query tile's seen key blocks, highest first, 32 blocks per summary
//   load (ColumnBlockWalk): blocks the mask hides from every row of the tile are neither loaded
//   nor computed, and the announcement counts only the seen ones;
// - each K stage carries a tag (ColumnTag: the block's index and whether the mask cuts it),
//   written before the stage's K load arrives on its full barrier, so a consumer that has waited
//   for the K also sees its tag;
// - the consumers mask a cut block element-wise on the wgmma accumulator (hide_column_scores).
// Per tile, not per consumer slice: every warpgroup takes every seen block (TileMask::
// kSlicesSkipBlocks is false for the kind, also on d64's 128 x 64 pair tile), and a block the mask
// hides from one slice but not the other is cut for both.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/column_mask.cuh"
#include "cuda/common/column_summary.h"
#include "cuda/sm90/mask.cuh"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm90 {

// A K stage's block under a column mask, one word: index n (>= 0; dispatch keeps keys within
// int32, and blocks are at least 64 keys, so n < 2^25) and the mask's cut bit at the bottom.
struct ColumnTag {
  static constexpr int kCutBit = 1;
  static constexpr int kIndexShift = 1;
  __device__ __forceinline__ static int of(int n, bool cut) { return n << kIndexShift | (cut ? kCutBit : 0); }
  __device__ __forceinline__ static int block(int tag) { return tag >> kIndexShift; }
  __device__ __forceinline__ static bool cut(int tag) { return (tag & kCutBit) != 0; }
};

// Producer: the stage's tag, after the stage was acquired (every consumer warp has read the tag of
// its previous block) and before the K load's arrive on its full barrier, whose release the
// consumers' wait acquires. An atomic, as in tile_announcement.cuh: the barrier already orders it,
// but compute-sanitizer's racecheck does not follow that chain.
__device__ __forceinline__ void write_column_tag(int& slot, int tag) { atomicExch(&slot, tag); }

// Consumer warp, once it has waited for the stage's K and before it gives that K back: lane 0
// reads, the others take it by shuffle (one shared-memory atomic per warp; the value warp-uniform).
__device__ __forceinline__ int read_column_tag(int& slot, int lane) {
  const int mine = lane == 0 ? atomicAdd(&slot, 0) : 0;
  return __shfl_sync(0xffffffffu, mine, 0);
}

// The seen key blocks of one query tile's rows [r0, r1) among the window's blocks [lo, hi),
// highest first. Warp-collective (all 32 lanes call each member together, and every lane gets the
// same answer): lane l reads the summary of block base - l, so a run of blocks the mask hides
// costs one load per 32 of them. The producer counts the tile's seen blocks first (the consumers'
// loop needs the count up front, announcement) and then walks them, reading each 32 blocks twice.
struct ColumnBlockWalk {
  static constexpr int kLanes = 32;
  ColumnMaskView mask;
  int lo, r0, r1;
  int base = 0;       // the chunk's highest block; lane l's block is base - l
  unsigned seen = 0;  // the chunk's seen blocks not yet taken, a bit per lane
  unsigned cut = 0;   // the chunk's blocks that the mask cuts

  // column_cover's rule (common/column_summary.h), one interval's int4 at a time: on the producer
  // warp's few registers (kColumnProducerRegisters) both intervals' loads in flight at once spilled.
  __device__ __forceinline__ ColumnCover cover(int n) const {
    const int4* block = mask.blocks + n * kColumnSummaryStride;
    bool hidden = false, untouched = true;
#pragma unroll 1
    for (int i = 0; i < kColumnSummaryIntervals; ++i) {
      const int4 b = block[i];
      hidden = hidden || (b.y <= r0 && b.z >= r1);
      untouched = untouched && (b.x >= r1 || b.w <= r0);
    }
    return {!hidden, !untouched};
  }

  __device__ __forceinline__ void load_chunk(int chunk_base, int lane) {
    base = chunk_base;
    const int n = base - lane;
    const ColumnCover c = n >= lo ? cover(n) : ColumnCover{false, false};
    seen = __ballot_sync(0xffffffffu, c.seen);
    cut = __ballot_sync(0xffffffffu, c.cut);
  }

  // How many blocks of [lo, hi) some row of [r0, r1) sees.
  __device__ __forceinline__ int count(int hi, int lane) {
    int total = 0;
    for (int b = hi - 1; b >= lo; b -= kLanes) {
      load_chunk(b, lane);
      total += __popc(seen);
    }
    base = hi - 1 + kLanes;  // next() starts over at the top
    seen = 0;
    return total;
  }

  // The next seen block's tag (ColumnTag), going down. Only while count() says one is left.
  __device__ __forceinline__ int next(int lane) {
    while (seen == 0) load_chunk(base - kLanes, lane);
    const int first = __ffs(static_cast<int>(seen)) - 1;  // the lowest lane holds the highest block
    const unsigned bit = 1u << first;
    seen &= ~bit;
    return ColumnTag::of(base - first, (cut & bit) != 0);
  }
};

// Keys whose bounds a consumer thread loads at once in a cut block's key loop (HiddenPairs::find,
// blocks of more than kColumnRunsMax runs): one at a time, the loop's serial L1 waits took half of
// the kernel's stall samples on short documents (ncu, d64, 32-512-token documents; docs/hopper.md,
// session 51). Two CTAs per SM (the d64 pair tile, 96 registers per consumer thread beside the
// column producer) hold two without spilling (four spilled 16 B), and the other CTA's warps share
// the waits.
constexpr int column_bounds_in_flight(int ctas_per_sm) { return ctas_per_sm == 1 ? 4 : 2; }

// Consumer thread: hides (-inf) the scores of key block n that the mask hides, on its wgmma
// accumulator s (64 x kBlockN, ptx/wgmma.cuh): rows row0 and row0 + 8, keys
// n * kBlockN + col0 + 8 j + {0, 1}, s[4 j + 2 half + e] the score of row half, key 8 j + e. The
// hidden pairs are found as bits first (HiddenPairs: run by run from the block's summary, or by a
// loop over the keys, kInFlight keys' bounds read at once through the read-only cache), then
// applied.
template <int kBlockN, int kInFlight, int kAcc>
__device__ __forceinline__ void hide_column_scores(float (&s)[kAcc], const FwdParams& p, const ColumnMaskView& mask,
                                                   int n, int row0, int col0, int len_k) {
  constexpr int kRows = 2, kRowStep = 8, kKeyStep = 8, kKeysPerStep = 2;
  constexpr int kKeys = kAcc / kRows;
  static_assert(kAcc == kBlockN / 2, "a whole block's accumulator (no narrow block under column masks)");
  HiddenPairs<kKeys, kRows> pairs;
  pairs.template find<kInFlight>(p, mask, n, FragmentKeys<kKeysPerStep, kKeyStep, 1>{n * kBlockN, col0},
                                 [row0](int r) { return row0 + r * kRowStep; }, len_k);
#pragma unroll
  for (int k = 0; k < kKeys; ++k)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (pairs.hidden(k, r)) s[2 * kRows * (k / kKeysPerStep) + kKeysPerStep * r + k % kKeysPerStep] = -INFINITY;
}

}  // namespace fusedattn::cuda::sm90
