// The mask policy for one query tile on the wgmma accumulator layout: which KV blocks are visible
// at all (the rest are never loaded), which of those the window's edges or the sequence end cut
// (only those are masked element-wise), and the element-wise mask itself. Every decision goes
// through key_range() in include/fusedattn/params.h, the one rule all backends share. Rows are
// tiled rows (row_packing.h): with GQA packing a row's query position is row >> shift. The
// lengths are the tile's sequence's (seq_info(): the launch's for dense batches, the sequence's
// own in a variable-length one).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/int_math.h"
#include "cuda/common/kinds.h"
#include "fusedattn/params.h"

// Compile-time ablation of TileMask::kCutsOnlyFirstBlock: 0 keeps the full mask's masked loop step
// everywhere; _MIN_KEYS is the narrowest KV block that drops it (for an A/B of the tile widths not
// yet measured: tools/ab_build.sh with AB_VALUES).
#ifndef FUSEDATTN_SM90_FULL_LOOP_UNMASKED
#define FUSEDATTN_SM90_FULL_LOOP_UNMASKED 1
#endif
#ifndef FUSEDATTN_SM90_FULL_LOOP_UNMASKED_MIN_KEYS
#define FUSEDATTN_SM90_FULL_LOOP_UNMASKED_MIN_KEYS 128
#endif
// Compile-time ablation: which masked tiles run their KV blocks lowest first (TileMask::kAscending):
// 0 none, 1 those whose slices take every block, 2 every masked tile of 128 rows, 3 (default)
// those whose slices skip blocks.
#ifndef FUSEDATTN_SM90_ASCENDING_MASKED
#define FUSEDATTN_SM90_ASCENDING_MASKED 3
#endif

namespace fusedattn::cuda::sm90 {

struct KVBlockRange {
  int lo, hi;  // visible KV blocks are [lo, hi); empty when lo >= hi
  __device__ int count() const { return hi > lo ? hi - lo : 0; }
};

// What the mask needs of a consumer warpgroup's 64-row slice of the current tile: the first query
// row and the KV blocks that need no element-wise mask.
struct MaskedSlice {
  int first_row;
  KVBlockRange uncut;
  int len_q, len_k;  // the tile's sequence
};

template <MaskKind kMask, int kBlockM, int kBlockN, int kClusterCtas = 1>
struct TileMask {
  // Whether a consumer warpgroup skips the blocks of its tile that its 64 rows do not see at all
  // (Consumer::mma_tile; the producer then announces each slice's blocks). Under a causal mask
  // that happens where a slice's last row and the tile's fall in different KV blocks: with 80-key
  // blocks at d256 (4 of a 512-query head's 18 block steps), in the 192-row d64 tile and with
  // 64-key blocks (a 128-row tile's first slice never sees its diagonal's second block). In a
  // square tile (128 x 128) the square causal grid never skips, so those tiles (and full masks,
  // whose slices see every block) keep the plain loop and the producer works out no per-slice
  // ranges for them. Nor do column masks: their producer walks a tile's seen blocks
  // (column_mask.cuh), and a slice that sees none of a block's keys masks the whole block.
  // In a masked cluster every tile's slices skip too: a CTA loads the blocks of the cluster's
  // query tiles together, and its own rows see only some of them (tile_announcement.cuh).
  static constexpr bool kMasked = kMask != MaskKind::kFull && kMask != MaskKind::kColumn;
  static constexpr bool kOwnSlicesSkipBlocks = kMasked && kBlockN < kBlockM;
  static constexpr bool kSlicesSkipBlocks = kOwnSlicesSkipBlocks || (kMasked && kClusterCtas > 1);

  // The order of a tile's KV blocks. Masked tiles of 128 rows or fewer whose slices skip blocks
  // of their own tile (kOwnSlicesSkipBlocks: d256's and d192's 64/80/112-key tiles, d64's pair
  // tile) take them lowest first; the others highest first (d128's pairs too). Two reasons to
  // expect lowest first to pay under a causal mask (docs/hopper.md, sessions 41-43):
  // - the concurrent tiles of one head then read the same K/V block at about the same time, as
  //   a full mask's do; highest first, a head's tiles of consecutive lengths are a block apart
  //   throughout, and the causal launch put twice the full mask's L2 load per unit of time;
  // - a row's reference max comes from a whole block, not from the cut diagonal, whose top rows
  //   see few keys, so the next block's sum check does not fail in most warps.
  // The cut diagonal then comes last, inside the overlapped loop, at full width (no narrow block).
  // On the H200 (session 43, fp16 causal) lowest first gained 1.7% / 3.5% / 0.4% at d256 2k / 4k /
  // 8k, and lost 2.1% / 0.5% at d128 2k / 4k (1.5% at 2k with the narrow block off in both), so
  // the 128-key tiles keep highest first. The 192-row d64 tile spilled 4 B with it.
  static constexpr int kAscendingMaxRows = 128;
  static constexpr bool kAscending =
      kMask != MaskKind::kFull && kBlockM <= kAscendingMaxRows &&
      (FUSEDATTN_SM90_ASCENDING_MASKED == 2 || (FUSEDATTN_SM90_ASCENDING_MASKED == 1 && !kOwnSlicesSkipBlocks) ||
       (FUSEDATTN_SM90_ASCENDING_MASKED == 3 && kOwnSlicesSkipBlocks));
  // A loop over `blocks` in that order: first_block, then next_block while block_in_loop;
  // is_last_block(n): n is the last.
  __device__ __forceinline__ static int first_block(const KVBlockRange& blocks) {
    return kAscending ? blocks.lo : blocks.hi - 1;
  }
  __device__ __forceinline__ static int next_block(int n) { return kAscending ? n + 1 : n - 1; }
  __device__ __forceinline__ static bool block_in_loop(const KVBlockRange& blocks, int n) {
    return kAscending ? n < blocks.hi : n >= blocks.lo;
  }
  __device__ __forceinline__ static bool is_last_block(const KVBlockRange& blocks, int n) {
    return n == (kAscending ? blocks.hi - 1 : blocks.lo);
  }
  // How many of the tile's blocks the loop takes before those of `mine` (a slice's, within them):
  // the blocks a slice that sees only `mine` skips first (kSlicesSkipBlocks).
  __device__ __forceinline__ static int blocks_before(const KVBlockRange& blocks, const KVBlockRange& mine) {
    return kAscending ? mine.lo - blocks.lo : blocks.hi - mine.hi;
  }

  // A slice's first (highest) block is narrow when none of its rows sees a key of the block's
  // second half: the causal diagonal block of the first slice of a 128 x 128 tile, whose last row
  // sees the block's first 64 keys. The consumer then computes S, the mask and the softmax on
  // the first kNarrowKeys columns only (a wgmma of half the width) and gives P zeros beyond.
  // Masked launches only: a full mask's last block is narrow only where len_k % kBlockN is in
  // (0, kBlockN / 2], which the common lengths never are. Not under column masks: a tile's first
  // block there is its highest seen one, not the window's (sm90/column_mask.cuh).
  static constexpr int kNarrowKeys = kBlockN / 2;
  static constexpr bool kNarrowsFirstBlock =
      kMask != MaskKind::kFull && kMask != MaskKind::kColumn && kNarrowKeys % 8 == 0 && !kAscending;

  // Whether only the first block a slice takes can be cut. Under a full mask only the sequence end
  // cuts, and only the tile's highest block, which every loop takes first (a split tile's last
  // part, tile_announcement.cuh, holds it as its own highest): the overlapped loop after it then
  // needs no masked step, whose copies would only sit between the hot ones in the instruction
  // cache (docs/hopper.md, session 41). Only tiles of 128-key blocks: d64, d96 and d128 full
  // 2k-4k gained 1-4% on the H200, while d256's 64-key tiles (2k, and the pairs at 4k) lost ~1%
  // (session 42); the 80-key d256 and 112-key d192 tiles were not measured and keep the copies.
  static constexpr int kUnmaskedLoopMinKeys = FUSEDATTN_SM90_FULL_LOOP_UNMASKED_MIN_KEYS;
  static constexpr bool kCutsOnlyFirstBlock =
      kMask == MaskKind::kFull && kBlockN >= kUnmaskedLoopMinKeys && FUSEDATTN_SM90_FULL_LOOP_UNMASKED != 0;

  const FwdParams& p;
  RowPacking packing;  // KernelParams::packing
  int len_q, len_k;    // the tile's sequence (int32 in the kernel, like the TMA coordinates)

  __device__ __forceinline__ int64_t position(int64_t row) const { return packing.position(row); }
  // Tiled rows per (tile head, batch) pair.
  __device__ __forceinline__ int64_t rows() const { return packing.rows(int64_t{len_q}); }

  // Keys visible to any of the query rows [row_first, row_last]. key_range's lo and hi both grow
  // with the row, so their union is [lo(row_first), hi(row_last)].
  __device__ __forceinline__ KVBlockRange kv_blocks_of_rows(int64_t row_first, int64_t row_last) const {
    if constexpr (kMask == MaskKind::kFull) {
      return {0, ceil_div(len_k, kBlockN)};
    } else {
      const int64_t lo = key_range(p, position(row_first), len_q, len_k).lo;
      const int64_t hi = key_range(p, position(row_last), len_q, len_k).hi;
      if (hi < lo) return {0, 0};
      return {static_cast<int>(lo / kBlockN), static_cast<int>(hi / kBlockN + 1)};
    }
  }

  // Whether the rows up to row_last see no key of block n's second half (see kNarrowsFirstBlock).
  __device__ __forceinline__ bool narrow_block(int64_t row_last, int n_block) const {
    return key_range(p, position(row_last), len_q, len_k).hi < int64_t{n_block} * kBlockN + kNarrowKeys;
  }

  // The KV blocks of the query tile that starts at first_row, or of `tiles` tiles from there (a
  // cluster's, which all load the same blocks): those any of their rows sees.
  __device__ __forceinline__ KVBlockRange kv_blocks(int first_row, int tiles = 1) const {
    const int64_t end = int64_t{first_row} + int64_t{kBlockM} * tiles;
    return kv_blocks_of_rows(first_row, (end < rows() ? end : rows()) - 1);
  }

  // Keys are int32 inside the kernel (the TMA coordinates are int32 too; dispatch keeps longer
  // sequences off this kernel), so per-block mask tests are 32-bit compares against bounds
  // computed once per tile.
  struct Bounds {
    int lo, hi;  // visible keys [lo, hi]; lo > hi when none
  };
  __device__ __forceinline__ Bounds bounds_of_row(int64_t row) const {
    const KeyRange kr = key_range(p, position(row), len_q, len_k);
    return {static_cast<int>(kr.lo), static_cast<int>(kr.hi < kr.lo - 1 ? kr.lo - 1 : kr.hi)};
  }

  // The right bound alone, for masks without a left edge (see left_bounded: every row's keys
  // start at 0): only key_range's hi is computed. A row with no keys (hi < 0) gets -1, so the
  // bound shifted to a thread's first key cannot wrap.
  __device__ __forceinline__ int right_bound_of_row(int64_t row) const {
    const int64_t hi = key_range(p, position(row), len_q, len_k).hi;
    return static_cast<int>(hi < kNoKey ? kNoKey : hi);
  }
  static constexpr int kNoKey = -1;

  // For query rows [row_first, row_last]: the KV blocks that need no element-wise mask, i.e. where
  // every row sees all keys. lo and hi both grow with the row, so that is where the largest lo
  // (the last row's) <= the block's first key and the smallest hi (the first row's) >= its last;
  // those blocks are contiguous. Empty (lo >= hi) when every block is cut.
  __device__ __forceinline__ KVBlockRange uncut_blocks(int64_t row_first, int64_t row_last) const {
    const int key_lo = bounds_of_row(row_last).lo, key_hi = bounds_of_row(row_first).hi;  // key_hi >= -1
    return {ceil_div(key_lo, kBlockN), (key_hi + 1) / kBlockN};
  }
  __device__ __forceinline__ static bool cuts(const KVBlockRange& uncut, int n_block) {
    return n_block < uncut.lo || n_block >= uncut.hi;
  }

  // Whether a row's visible keys can start after key 0, i.e. the window has a left edge. The full
  // mask and causal (window_left unbounded) see every key from 0 on, so their cut blocks need only
  // the right bound tested. A kernel parameter: the same for every thread.
  __device__ __forceinline__ bool left_bounded() const {
    if constexpr (kMask == MaskKind::kFull) return false;
    else return p.window_left >= 0;
  }

  // Sets S to -inf outside each row's keys. s is a 64 x kBlockN wgmma accumulator, or its first
  // kAcc registers (a narrow block's first columns): this thread holds two rows (bounds rows[0],
  // rows[1]) and columns 8j + col0 + {0, 1} (see ptx/wgmma.cuh).
  // The bounds are shifted once per row to this thread's first key, so each element is two
  // compares of its compile-time offset 8j + e and a select.
  template <int kAcc>
  __device__ __forceinline__ static void apply(float (&s)[kAcc], int n_block, const Bounds (&rows)[2], int col0) {
    static_assert(kAcc <= kBlockN / 2 && kAcc % 4 == 0);
    const int thread_first_key = n_block * kBlockN + col0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int lo = rows[half].lo - thread_first_key, hi = rows[half].hi - thread_first_key;
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (8 * j + e < lo || 8 * j + e > hi) s[4 * j + 2 * half + e] = -INFINITY;
    }
  }

  // The same without a left edge (right bounds from right_bound_of_row): one compare per element.
  template <int kAcc>
  __device__ __forceinline__ static void apply_right(float (&s)[kAcc], int n_block, const int (&row_hi)[2], int col0) {
    static_assert(kAcc <= kBlockN / 2 && kAcc % 4 == 0);
    const int thread_first_key = n_block * kBlockN + col0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hi = row_hi[half] - thread_first_key;
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (8 * j + e > hi) s[4 * j + 2 * half + e] = -INFINITY;
    }
  }
};

}  // namespace fusedattn::cuda::sm90
