// The backward's view of the attention mask: which query blocks a KV block must visit, which
// (query block, KV block) pairs need element-wise masking, and the element-wise rule itself.
// Everything derives from key_range() in fusedattn/params.h (bottom-right aligned windows), so
// the kernels agree with every other backend. Host/device so the CPU can check it by brute force.
#pragma once

#include <cstdint>

#include "cuda/common/int_math.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// A half-open range of block indices.
struct BlockRange {
  int64_t begin, end;
  FUSEDATTN_HD bool empty() const { return begin >= end; }
};

// Query rows [first, last] that see at least one key of [key_first, key_last]. Row i sees keys
// [lo(i), hi(i)] with lo and hi non-decreasing in i, so the answer is an interval: hi(i) >=
// key_first bounds it below, lo(i) <= key_last above. Any row inside also has lo(i) <= hi(i),
// so rows without keys never appear. Empty when first > last.
struct RowRange {
  int64_t first, last;
};
FUSEDATTN_HD RowRange rows_seeing_keys(const FwdParams& p, int64_t key_first, int64_t key_last, int64_t len_q,
                                       int64_t len_k) {
  const int64_t offset = len_k - len_q;  // row i lines up with key i + offset
  int64_t first = p.window_right >= 0 ? key_first - offset - p.window_right : 0;
  int64_t last = p.window_left >= 0 ? key_last - offset + p.window_left : len_q - 1;
  if (first < 0) first = 0;
  if (last > len_q - 1) last = len_q - 1;
  return {first, last};
}

// Query blocks (of block_m rows) that KV block n (of block_n keys) contributes to.
FUSEDATTN_HD BlockRange query_blocks_of_kv_block(const FwdParams& p, int64_t n, int block_m, int block_n,
                                                 int64_t len_q, int64_t len_k) {
  const int64_t key_first = n * block_n;
  const int64_t key_last = key_first + block_n - 1 < len_k - 1 ? key_first + block_n - 1 : len_k - 1;
  if (key_first > key_last || len_q <= 0) return {0, 0};
  const RowRange r = rows_seeing_keys(p, key_first, key_last, len_q, len_k);
  if (r.first > r.last) return {0, 0};
  return {r.first / block_m, r.last / block_m + 1};
}

// The first KV block that contributes to query block m (the deterministic mode adds the
// contributions of KV blocks in increasing order, starting from this one). Rows without keys
// only sit at the ends of the row range; the first row of the block that has keys is the
// later of the block's first row and the first row seeing key 0.
FUSEDATTN_HD int64_t first_kv_block_of_query_block(const FwdParams& p, int64_t m, int block_m, int block_n,
                                                   int64_t len_q, int64_t len_k) {
  const RowRange with_keys = rows_seeing_keys(p, 0, len_k - 1, len_q, len_k);
  int64_t row = m * block_m;
  if (row < with_keys.first) row = with_keys.first;
  return key_range(p, row, len_q, len_k).lo / block_n;
}

// True when some (row, key) pair of the block is masked: keys past len_k, or a window edge cutting
// through it. Rows past len_q need no mask: their lse2 is +inf, so P = 0 there anyway.
FUSEDATTN_HD bool block_needs_mask(const FwdParams& p, bool windowed, int64_t m, int64_t n, int block_m, int block_n,
                                   int64_t len_q, int64_t len_k) {
  const int64_t key_first = n * block_n, key_last = key_first + block_n - 1;
  if (key_last > len_k - 1) return true;
  if (!windowed) return false;
  const int64_t row_first = m * block_m;
  const int64_t row_last = row_first + block_m - 1 < len_q - 1 ? row_first + block_m - 1 : len_q - 1;
  // lo/hi are monotone: the last row has the largest lo, the first row the smallest hi.
  return key_range(p, row_last, len_q, len_k).lo > key_first || key_range(p, row_first, len_q, len_k).hi < key_last;
}

// The query blocks of KV block n that need no mask (block_needs_mask false), as one half-open
// range: a window's edges only cut the blocks at the two ends of the diagonal band, so the test
// per iteration is two 32-bit compares instead of two key_range evaluations in 64 bits. With
// diag(i) = i + len_k - len_q and the block's keys inside len_k:
//   the last row sees key_first   iff  row_last  <= key_first - diag(0) + window_left   (end)
//   the first row sees key_last   iff  row_first >= key_last - diag(0) - window_right  (begin)
// (the clips of key_range at 0 and len_k - 1 cannot decide either compare). row_last is clipped
// to len_q - 1, so the end bound holds for every block once it holds for len_q - 1.
FUSEDATTN_HD int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

FUSEDATTN_HD BlockRange unmasked_query_blocks(const FwdParams& p, bool windowed, int64_t n, int block_m, int block_n,
                                              int64_t len_q, int64_t len_k) {
  const int64_t blocks = ceil_div(len_q, block_m);
  const int64_t key_first = n * block_n, key_last = key_first + block_n - 1;
  if (key_last > len_k - 1) return {0, 0};
  BlockRange r{0, blocks};
  if (!windowed) return r;
  const int64_t diag0 = len_k - len_q;
  if (p.window_left >= 0) {
    const int64_t last_row = key_first - diag0 + p.window_left;  // the last row that sees key_first
    if (last_row < len_q - 1) r.end = floor_div(last_row + 1, block_m);
  }
  if (p.window_right >= 0) r.begin = -floor_div(-(key_last - diag0 - p.window_right), block_m);  // ceil
  if (r.begin < 0) r.begin = 0;
  if (r.end > blocks) r.end = blocks;
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// Element-wise rule of key_range (unclipped) for the elements of one lane, (key_base + dk, row_base +
// dr) with small tile offsets dk, dr: row i sees key j iff j < len_k and diag(i) - window_left <=
// j <= diag(i) + window_right, diag(i) = i + len_k - len_q. Relative to the lane's first element
// the bounds become 32-bit limits on dk and dk - dr, so the per-element test is three integer
// compares instead of 64-bit positions per element (registers the main loop cannot spare).
struct LaneMask {
  int keys_left;      // dk < keys_left: the key exists
  int lo, hi;         // lo <= dk - dr <= hi: inside the window
  FUSEDATTN_HD bool visible(int dk, int dr) const { return dk < keys_left && dk - dr >= lo && dk - dr <= hi; }
};

// Limits are clamped far beyond any tile offset, which keeps them in 32 bits.
constexpr int64_t kLaneMaskClamp = int64_t{1} << 30;

FUSEDATTN_HD int lane_mask_clamp(int64_t x) {
  return static_cast<int>(x < -kLaneMaskClamp ? -kLaneMaskClamp : x > kLaneMaskClamp ? kLaneMaskClamp : x);
}

FUSEDATTN_HD LaneMask lane_mask(const FwdParams& p, bool windowed, int64_t key_base, int64_t row_base, int64_t len_q,
                                int64_t len_k) {
  LaneMask mask{lane_mask_clamp(len_k - key_base), static_cast<int>(-kLaneMaskClamp), static_cast<int>(kLaneMaskClamp)};
  if (windowed) {
    // key - row = (key_base - row_base) + dk - dr is compared with len_k - len_q -/+ the window.
    const int64_t diag = len_k - len_q - (key_base - row_base);
    if (p.window_left >= 0) mask.lo = lane_mask_clamp(diag - p.window_left);
    if (p.window_right >= 0) mask.hi = lane_mask_clamp(diag + p.window_right);
  }
  return mask;
}

}  // namespace fusedattn::cuda::sm80
