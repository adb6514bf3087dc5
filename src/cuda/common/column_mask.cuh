// Column-sparse masks (FwdParams::column_mask, FlashMask's representation) in the CUDA kernels
// (the portable ones; the Hopper forward through sm90/column_mask.cuh): key j of (batch b, mask
// head) hides itself from one or two intervals of query rows.
//
// Which (query block, key block) pairs to skip or to mask comes from a per-block summary of the
// bounds (the least and greatest start and end of each interval over a block's keys), written
// once per call before the attention kernel; common/column_summary.h has it and the rules that
// read it. Here: the forward's walk over the seen key blocks, and the element-wise masks of the
// blocks a mask cuts.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/common/column_summary.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

// The next key block a warp visits, going down, and whether the mask cuts it.
struct ColumnVisit {
  int n;  // lo - 1 when no block in [lo, from] is seen
  bool cut;
};

// One (batch, query head)'s mask: its keys' bounds and its blocks' summary. The key stride and
// the interval count stay in the kernel's parameters (read where used, from the constant bank):
// held in registers across the d128 forward's loop they made it spill.
struct ColumnMaskView {
  const int32_t* keys;  // key 0's bounds; key j's start j * p.column_mask_stride.row later
  const int4* blocks;   // block 0's summary

  static __device__ __forceinline__ ColumnMaskView of(const FwdParams& p, const ColumnSummary& s, int batch,
                                                      int head) {
    const int64_t mask_head = static_cast<int64_t>(batch) * column_mask_heads(p) + column_mask_head(p, head);
    return {column_mask_keys(p, batch, head), s.bounds + mask_head * s.blocks * kColumnSummaryIntervals};
  }

  __device__ __forceinline__ ColumnCover cover(int n, int r0, int r1) const {
    return column_cover(blocks + n * kColumnSummaryIntervals, r0, r1);
  }

  // The highest block in [lo, from] that some row of [r0, r1) sees. Warp-collective: each lane
  // reads one block's summary, so a run of hidden blocks costs one load per 32 of them; every lane
  // gets the same answer. All 32 lanes must call it together.
  __device__ __forceinline__ ColumnVisit next_seen(int from, int lo, int r0, int r1) const {
    constexpr unsigned kAllLanes = 0xffffffffu;
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int base = from; base >= lo; base -= 32) {
      const int n = base - lane;
      const ColumnCover c = n >= lo ? cover(n, r0, r1) : ColumnCover{false, false};
      const unsigned seen = __ballot_sync(kAllLanes, c.seen), cut = __ballot_sync(kAllLanes, c.cut);
      if (seen != 0) {
        const int first = __ffs(seen) - 1;  // the lowest lane holds the highest block
        return {base - first, ((cut >> first) & 1u) != 0};
      }
    }
    return {lo - 1, false};
  }

  // Whether key `key` hides from row `row`; the bounds are read through the read-only cache (the
  // lanes that share a key read the same words).
  struct KeyBounds {
    int s0 = 0, e0 = 0, s1 = 0, e1 = 0;  // empty intervals by default
    __device__ __forceinline__ bool hides(int row) const { return (row >= s0 && row < e0) || (row >= s1 && row < e1); }
  };
  __device__ __forceinline__ KeyBounds bounds(const FwdParams& p, int key) const {
    const int32_t* m = keys + key * p.column_mask_stride.row;
    const bool two = p.column_mask_intervals == 2;
    return {__ldg(m), __ldg(m + 1), two ? __ldg(m + 2) : 0, two ? __ldg(m + 3) : 0};
  }
};

// The rows of [0, len_q) that some key of block n may be seen by, for the query heads
// [head0, head0 + heads) (their union; one mask head for all unless the mask is per head).
__device__ __forceinline__ RowSpan seen_rows_of_group(const FwdParams& p, const ColumnSummary& s, int batch,
                                                      int head0, int heads, int n, int len_q) {
  RowSpan all{len_q, 0};
  for (int h = 0; h < (p.column_mask_per_head ? heads : 1); ++h) {
    const RowSpan seen = column_seen_rows(ColumnMaskView::of(p, s, batch, head0 + h).blocks + n * kColumnSummaryIntervals, len_q);
    if (seen.first < seen.end) all = {min(all.first, seen.first), max(all.end, seen.end)};
  }
  return all.first < all.end ? all : RowSpan{0, 0};
}

// The hidden (key, row) pairs of one thread's accumulator fragment: kKeys keys and kRows rows,
// whose positions key_at(k) and row_at(r) the kernel's fragment layout gives. Found as bits, a
// word per few keys, in a loop over the keys that is not unrolled (a few keys' bounds per
// iteration where the caller has the registers), then applied: unrolled, every key's bounds were
// loaded at once beside the fragment's registers. find_by_call() is the same
// search as a call, for tiles where even the loop spills inline (the call saves a few registers on
// its stack, on cut blocks only; sm80/tile_config.h says which). Keys at or past len_k are left to
// the sequence-end mask (their bounds do not exist).
template <int kKeys, int kRows>
struct HiddenPairs {
  static constexpr int kWordBits = 32;
  static constexpr int kKeysPerWord = kWordBits / kRows;
  static constexpr int kWords = (kKeys + kKeysPerWord - 1) / kKeysPerWord;
  static_assert(kKeysPerWord >= 1, "a word holds at least one key's rows");

  uint32_t words[kWords];  // word w, bit j * kRows + r: key w * kKeysPerWord + j hides from row r

  // The keys lie in key block `block` of the mask's summary. kInFlight: how many keys' bounds the
  // loop loads at once (each load waits for the L1 at least; where registers allow, a few in flight
  // share that wait).
  template <int kInFlight = 1, typename KeyAt, typename RowAt>
  __device__ __forceinline__ void find(const FwdParams& p, const ColumnMaskView& mask, int block, KeyAt key_at,
                                       RowAt row_at, int len_k) {
    static_assert(kInFlight >= 1 && kKeysPerWord % kInFlight == 0, "a word's keys in whole batches");
    // Where every key of the block hides the same rows (its least and greatest bounds agree: keys
    // of one document), no key's own bounds are read: the rows' bits, found once, go to each key.
    const int4* summary = mask.blocks + block * kColumnSummaryIntervals;
    const int4 first = __ldg(summary), second = __ldg(summary + 1);
    if (first.x == first.y && first.z == first.w && second.x == second.y && second.z == second.w) {
      const ColumnMaskView::KeyBounds b{first.x, first.z, second.x, second.z};
      uint32_t rows = 0;
#pragma unroll
      for (int r = 0; r < kRows; ++r) rows |= static_cast<uint32_t>(b.hides(row_at(r))) << r;
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        uint32_t hidden = 0;
#pragma unroll
        for (int j = 0; j < kKeysPerWord && w * kKeysPerWord + j < kKeys; ++j)
          if (key_at(w * kKeysPerWord + j) < len_k) hidden |= rows << (j * kRows);
        words[w] = hidden;
      }
      return;
    }
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t hidden = 0;
#pragma unroll 1
      for (int j0 = 0; j0 < kKeysPerWord && w * kKeysPerWord + j0 < kKeys; j0 += kInFlight) {
        ColumnMaskView::KeyBounds b[kInFlight];
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) {
          const int k = w * kKeysPerWord + j0 + i;
          const int key = k < kKeys ? key_at(k) : len_k;
          b[i] = key < len_k ? mask.bounds(p, key) : ColumnMaskView::KeyBounds{};  // none: hides no row
        }
#pragma unroll
        for (int i = 0; i < kInFlight; ++i)
#pragma unroll
          for (int r = 0; r < kRows; ++r)
            hidden |= static_cast<uint32_t>(b[i].hides(row_at(r))) << ((j0 + i) * kRows + r);
      }
      words[w] = hidden;
    }
  }

  template <typename KeyAt, typename RowAt>
  __device__ __noinline__ void find_by_call(const FwdParams& p, const ColumnMaskView& mask, int block, KeyAt key_at,
                                            RowAt row_at, int len_k) {
    find(p, mask, block, key_at, row_at, len_k);
  }

  __device__ __forceinline__ bool hidden(int k, int r) const {
    return ((words[k / kKeysPerWord] >> (k % kKeysPerWord * kRows + r)) & 1u) != 0;
  }
};

// The forward's S accumulators, mma.m16n8k16 C fragments (as apply_mask in common/mask.cuh):
// s[mt][nt][2 * h + e] is row row0 + 16 mt + 8 h, key col0 + 8 nt + e. Hidden scores become -inf.
template <bool kByCall, int kMTiles, int kNTiles>
__device__ __forceinline__ void hide_column_scores(float (&s)[kMTiles][kNTiles][4], const FwdParams& p,
                                                   const ColumnMaskView& mask, int block, int row0, int col0,
                                                   int len_k) {
  constexpr int kTileRows = 16, kHalfRows = 8, kTileCols = 8;
  // Key k is (nt, e) = (k / 2, k % 2), row r is (mt, h) = (r / 2, r % 2).
  auto key_at = [col0](int k) { return col0 + k / 2 * kTileCols + k % 2; };
  auto row_at = [row0](int r) { return row0 + r / 2 * kTileRows + r % 2 * kHalfRows; };
  HiddenPairs<2 * kNTiles, 2 * kMTiles> pairs;
  if constexpr (kByCall)
    pairs.find_by_call(p, mask, block, key_at, row_at, len_k);
  else
    pairs.find(p, mask, block, key_at, row_at, len_k);
#pragma unroll
  for (int k = 0; k < 2 * kNTiles; ++k)
#pragma unroll
    for (int r = 0; r < 2 * kMTiles; ++r)
      if (pairs.hidden(k, r)) s[r / 2][k / 2][2 * (r % 2) + k % 2] = -INFINITY;
}

// The backward's P^T accumulators, also C fragments but keys on the rows: pt[mi][j][e] is key
// key0 + 16 mi + 8 (e / 2), query row row0 + 8 j + e % 2. Found before P^T exists (beside its
// registers the d128 backward spilled 196 B; as a call, with its stack, more), applied after.
template <int kKeyTiles, int kRowTiles>
struct HiddenProbabilities {
  static constexpr int kTileKeys = 16, kHalfKeys = 8, kTileRows = 8;
  HiddenPairs<2 * kKeyTiles, 2 * kRowTiles> pairs;

  __device__ __forceinline__ void find(const FwdParams& p, const ColumnMaskView& mask, int block, int key0, int row0,
                                       int len_k) {
    // Key k is (mi, e / 2) = (k / 2, k % 2), row r is (j, e % 2) = (r / 2, r % 2).
    pairs.find(
        p, mask, block, [key0](int k) { return key0 + k / 2 * kTileKeys + k % 2 * kHalfKeys; },
        [row0](int r) { return row0 + r / 2 * kTileRows + r % 2; }, len_k);
  }

  // Hidden probabilities become 0.
  __device__ __forceinline__ void apply(float (&pt)[kKeyTiles][kRowTiles][4]) const {
#pragma unroll
    for (int k = 0; k < 2 * kKeyTiles; ++k)
#pragma unroll
      for (int r = 0; r < 2 * kRowTiles; ++r)
        if (pairs.hidden(k, r)) pt[k / 2][r / 2][2 * (k % 2) + r % 2] = 0.f;
  }
};

}  // namespace fusedattn::cuda
