// Mask policies: which keys a query row may see, which KV blocks a query block must visit, which
// of those the mask cuts (only those are masked element-wise), and the element-wise apply on S
// fragments. Both policies follow key_range() in include/fusedattn/params.h, the one rule every
// backend shares; the sequence end (key >= len_k) is part of it, so the partial last KV block is
// masked by the same code as a causal diagonal.
//
// Policy interface (the sm80 forward kernel; the backward keeps its own in bwd_mask.h):
//   KeyRange keys(i)                       keys [lo, hi] query row i sees (empty when lo > hi)
//   BlockRange kv_blocks(i_first, i_last, block_n)
//                                          KV blocks [n_lo, n_hi) rows i_first..i_last touch
//   BlockRange uncut_blocks(i_first, i_last, block_n)
//                                          the blocks that are not cut, precomputed once
//   KeyRange unclamped_keys(i)             keys(i) before the clamp to [0, len_k - 1]
//   kMayCutLeft                            whether a row's first key can be cut (a left window)
// and the free functions thread_window(policy, row0), cuts_left(policy, uncut, n),
// apply_mask<kLeft, kEnd>(s, window, col0) and mask_cut_block<Policy, kEnd>(s, window, col0,
// cut_left) for S accumulators in the mma C layout.
#pragma once

#include <cstdint>

#include "cuda/common/int_math.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

struct BlockRange {
  int lo, hi;  // [lo, hi): empty when hi <= lo
};

namespace mask_detail {
__device__ __forceinline__ int clamp_to(int64_t x, int lo, int hi) {
  return static_cast<int>(x < lo ? lo : (x > hi ? hi : x));
}
}  // namespace mask_detail

// Both policies share the block logic; they differ only in keys(). key_range() is monotone: lo and
// hi never decrease as i grows, so a query block's keys are [lo(first), hi(last)] and every row
// of it sees at least [lo(last), hi(first)].
template <typename Derived>
struct MaskBase {
  int64_t len_q, len_k;

  __device__ __forceinline__ KeyRange keys(int64_t i) const { return static_cast<const Derived*>(this)->keys(i); }

  __device__ __forceinline__ BlockRange kv_blocks(int64_t i_first, int64_t i_last, int block_n) const {
    const int64_t lo = keys(i_first).lo, hi = keys(i_last).hi;
    if (hi < lo) return {0, 0};
    return {static_cast<int>(lo / block_n), static_cast<int>(ceil_div(hi + 1, block_n))};
  }

  // KV blocks [lo, hi) whose every (row, key) pair rows i_first..i_last see: the complement (within
  // kv_blocks) is where the mask is cut. Loop-invariant, so the per-block test is two int compares.
  // lo is kept even when the range is empty (hi < lo of the keys gives hi <= lo of the blocks):
  // blocks from lo on start at or after every row's first key (cuts_left relies on it).
  __device__ __forceinline__ BlockRange uncut_blocks(int64_t i_first, int64_t i_last, int block_n) const {
    const int64_t lo = keys(i_last).lo, hi = keys(i_first).hi;
    return {static_cast<int>(ceil_div(lo, block_n)), static_cast<int>((hi + 1) / block_n)};
  }
};

// No window: every row sees keys [0, len_k - 1] (key_range with window_left = window_right = -1).
struct MaskFull : MaskBase<MaskFull> {
  static constexpr bool kMayCutLeft = false;
  __device__ __forceinline__ MaskFull(const FwdParams&, int64_t lq, int64_t lk) : MaskBase<MaskFull>{lq, lk} {}
  __device__ __forceinline__ KeyRange keys(int64_t) const { return {0, len_k - 1}; }
  // Before clamping to [0, len_k - 1]: unbounded on both sides (apply_mask clamps).
  __device__ __forceinline__ KeyRange unclamped_keys(int64_t) const { return {INT64_MIN / 2, INT64_MAX / 2}; }
};

// Causal and sliding windows, bottom-right aligned: exactly key_range().
struct MaskWindow : MaskBase<MaskWindow> {
  static constexpr bool kMayCutLeft = true;  // only with window_left >= 0 (never causal)
  int64_t window_left, window_right;  // -1 = unbounded
  __device__ __forceinline__ MaskWindow(const FwdParams& p, int64_t lq, int64_t lk)
      : MaskBase<MaskWindow>{lq, lk}, window_left(p.window_left), window_right(p.window_right) {}

  __device__ __forceinline__ KeyRange keys(int64_t i) const {
    FwdParams w;  // key_range reads only the window from the params
    w.window_left = window_left;
    w.window_right = window_right;
    return key_range(w, i, len_q, len_k);
  }

  // key_range() before its clamp to [0, len_k - 1]; an unbounded side is a far sentinel.
  __device__ __forceinline__ KeyRange unclamped_keys(int64_t i) const {
    const int64_t diag = i + len_k - len_q;
    return {window_left >= 0 ? diag - window_left : INT64_MIN / 2,
            window_right >= 0 ? diag + window_right : INT64_MAX / 2};
  }
};

// Sequence lengths must stay below this for the 32-bit key arithmetic of apply_mask (launchers
// check it): then every key index, window bound and block offset fits an int with room to spare.
constexpr int64_t kMaxMaskedSeqlen = int64_t{1} << 30;

// The keys one thread's first fragment row (row0) may see, before clamping, in 32 bits: key_range()
// of row row0 + dr is [max(0, lo + dr), min(last_key, hi + dr)]. Computed once per thread outside
// the KV loop, so the loop carries two ints (lo, hi) instead of 64-bit window parameters or a
// bound per row: apply_mask tests key offsets against them with the row offset dr folded into
// compile-time constants.
struct ThreadWindow {
  int lo, hi, last_key;
};

template <typename Mask>
__device__ __forceinline__ ThreadWindow thread_window(const Mask& mask, int64_t row0) {
  const KeyRange w = mask.unclamped_keys(row0);
  // Clamp the unbounded sentinels to just outside [-1, len_k] (a row's offsets dr are < 2^8).
  constexpr int kMargin = 1 << 16;
  const int lo = mask_detail::clamp_to(w.lo, -kMargin, static_cast<int>(mask.len_k) + kMargin);
  const int hi = mask_detail::clamp_to(w.hi, -kMargin, static_cast<int>(mask.len_k) + kMargin);
  return {lo, hi, static_cast<int>(mask.len_k) - 1};
}

// Whether cut KV block n (uncut = mask.uncut_blocks(...)) may hide keys left of some row's first
// key. Blocks from uncut.lo on start at or after the first key of the block's last row, which is
// the largest first key of its rows (key_range is monotone), so only their right side is cut: the
// causal diagonal and the sequence end always are.
template <typename Mask>
__device__ __forceinline__ bool cuts_left(const Mask&, BlockRange uncut, int n) {
  return Mask::kMayCutLeft && n < uncut.lo;
}

// Sets masked scores to -inf in S accumulators laid out as mma.m16n8k16 C fragments
// (src/cuda/ptx/mma_sm80.cuh): s[mt][nt][2*h + e] is row row0 + 16*mt + 8*h, key col0 + 8*nt + e,
// where row0 / col0 are this thread's first row (tile row g) and first key (tile column 2t), and
// w = thread_window(mask, row0). -inf (not a large negative number) so that exp2 gives exactly 0
// and a fully masked row is recognisable by its -inf maximum. kLeft = false skips the test
// against the rows' first keys, one compare per score, for blocks cuts_left() clears. kEnd =
// false skips the clamp to the sequence end, for blocks that end inside the sequence (every KV
// block but the sequence's last): their keys never pass it.
// A key col0 + c is never negative, so it is below row r's first key max(0, w.lo + dr) exactly
// when it is below w.lo + dr, i.e. c - dr < w.lo - col0: one register per side for all rows, the
// row and column offsets being constants of the compares (a clamped bound per row would cost a
// loop-carried register each).
template <bool kLeft, bool kEnd, int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_mask(float (&s)[kMTiles][kNTiles][4], ThreadWindow w, int col0) {
  constexpr int kTileRows = 16, kHalfRows = 8, kTileCols = 8;
  const int lo = w.lo - col0;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int dr = mt * kTileRows + h * kHalfRows;
      // Past the sequence end only in the last block: there the row's clamped last key, relative
      // to the same dr-shifted origin as the window side.
      const int hi = kEnd ? min(w.hi + dr, w.last_key) - dr - col0 : w.hi - col0;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = nt * kTileCols + e - dr;
          if ((kLeft && c < lo) || c > hi) s[mt][nt][2 * h + e] = -INFINITY;
        }
    }
}

// apply_mask on a KV block the mask cuts, cut_left = cuts_left(mask, uncut, n); kEnd: the block
// may reach past the sequence end (the first block visited). With a window the blocks only the
// right side cuts (every causal one) skip the left test. Without one the only cut block is the
// sequence's last, once per CTA, and its two-sided test stays: ptxas keeps one predicate pair per
// key for all rows there, while the one-sided test is recomputed per row and raises the register
// pressure of the whole loop.
template <typename Mask, bool kEnd, int kMTiles, int kNTiles>
__device__ __forceinline__ void mask_cut_block(float (&s)[kMTiles][kNTiles][4], ThreadWindow w, int col0,
                                               bool cut_left) {
  if (!Mask::kMayCutLeft || cut_left)
    apply_mask<true, kEnd>(s, w, col0);
  else
    apply_mask<false, kEnd>(s, w, col0);
}

}  // namespace fusedattn::cuda
