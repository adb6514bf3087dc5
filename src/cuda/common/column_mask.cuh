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
    return {column_mask_keys(p, batch, head), s.bounds + mask_head * s.blocks * kColumnSummaryStride};
  }

  __device__ __forceinline__ ColumnCover cover(int n, int r0, int r1) const {
    return column_cover(blocks + n * kColumnSummaryStride, r0, r1);
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
    const int4* block = ColumnMaskView::of(p, s, batch, head0 + h).blocks + n * kColumnSummaryStride;
    const RowSpan seen = column_seen_rows(block, len_q);
    if (seen.first < seen.end) all = {min(all.first, seen.first), max(all.end, seen.end)};
  }
  return all.first < all.end ? all : RowSpan{0, 0};
}

// The hidden (key, row) pairs of one thread's accumulator fragment: kKeys keys and kRows rows,
// whose positions `keys` (a FragmentKeys) and row_at(r) give. Found as bits, a word per few keys,
// then applied. Where the block's summary has its runs of keys with equal bounds
// (common/column_summary.h), each run's rows are tested once and its bits go to the keys it spans
// (documents: a run per document). Otherwise by a loop over the keys that is not unrolled (a few
// keys' bounds per iteration where the caller has the registers): unrolled, every key's bounds were
// loaded at once beside the fragment's registers. find<kInFlight, kByCall = true> makes the same
// search by calls (one per way), for tiles where even the loop spills inline (a call saves a few
// registers on its stack, on cut blocks only; sm80/tile_config.h says which). Keys at or past
// len_k are left to the sequence-end mask (their bounds do not exist).
template <int kKeys, int kRows>
struct HiddenPairs {
  static constexpr int kWordBits = 32;
  static constexpr int kKeysPerWord = kWordBits / kRows;
  static constexpr int kWords = (kKeys + kKeysPerWord - 1) / kKeysPerWord;
  static_assert(kKeysPerWord >= 1, "a word holds at least one key's rows");
  // Bit 0 of each key's kRows bits in a word: times a row pattern, each key's copy of it.
  static constexpr uint32_t every_key() {
    uint32_t bits = 0;
    for (int j = 0; j < kKeysPerWord; ++j) bits |= 1u << (j * kRows);
    return bits;
  }
  static constexpr uint32_t kEveryKey = every_key();

  uint32_t words[kWords];  // word w, bit j * kRows + r: key w * kKeysPerWord + j hides from row r

  // The keys lie in key block `block` of the mask's summary. kInFlight: how many keys' bounds the
  // key loop loads at once (each load waits for the L1 at least; where registers allow, a few in
  // flight share that wait). kByCall: each way is a call of its own (one call for both made the d128
  // portable forward's caller spill; the key loop's call takes one key at a time).
  template <int kInFlight = 1, bool kByCall = false, typename Keys, typename RowAt>
  __device__ __forceinline__ void find(const FwdParams& p, const ColumnMaskView& mask, int block, const Keys& keys,
                                       RowAt row_at, int len_k) {
    const int4* record = mask.blocks + block * kColumnSummaryStride;
    const int4 runs = __ldg(record + kColumnRunsHeader);
    if constexpr (kByCall) {
      if (runs.x > 0)
        find_by_runs_call(record, runs, keys, row_at, len_k);
      else
        find_by_keys_call(p, mask, keys, row_at, len_k);
    } else if (runs.x > 0) {
      find_by_runs(record, runs, keys, row_at, len_k);
    } else {
      find_by_keys<kInFlight>(p, mask, keys, row_at, len_k);
    }
  }

  // Key by key.
  template <int kInFlight, typename Keys, typename RowAt>
  __device__ __forceinline__ void find_by_keys(const FwdParams& p, const ColumnMaskView& mask, const Keys& keys,
                                               RowAt row_at, int len_k) {
    static_assert(kInFlight >= 1 && kKeysPerWord % kInFlight == 0, "a word's keys in whole batches");
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t hidden = 0;
#pragma unroll 1
      for (int j0 = 0; j0 < kKeysPerWord && w * kKeysPerWord + j0 < kKeys; j0 += kInFlight) {
        ColumnMaskView::KeyBounds b[kInFlight];
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) {
          const int k = w * kKeysPerWord + j0 + i;
          const int key = k < kKeys ? keys.key(k) : len_k;
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

  // Run by run: the keys of run r are the thread's keys [count_before(its start), count_before(its
  // end)), capped at those before len_k; each gets the run's rows' bits.
  template <typename Keys, typename RowAt>
  __device__ __forceinline__ void find_by_runs(const int4* record, const int4& runs, const Keys& keys, RowAt row_at,
                                               int len_k) {
    const int keys_seen = min(keys.count_before(len_k - keys.block_first), kKeys);
#pragma unroll
    for (int w = 0; w < kWords; ++w) words[w] = 0;
    int k0 = 0;  // the thread's first key of the run
#pragma unroll 1
    for (int r = 0; r < runs.x && k0 < keys_seen; ++r) {
      const int k1 = min(keys.count_before(column_run_end(runs, r)), keys_seen);
      if (k1 > k0) {
        // Two 8-byte loads: a 16-byte one wants four aligned registers, which the d128 portable
        // forward's call found only by spilling its caller.
        const int2* bounds = reinterpret_cast<const int2*>(record + kColumnRunBounds + r);
        const int2 first = __ldg(bounds), second = __ldg(bounds + 1);
        const ColumnMaskView::KeyBounds b{first.x, first.y, second.x, second.y};
        uint32_t rows = 0;
#pragma unroll
        for (int i = 0; i < kRows; ++i) rows |= static_cast<uint32_t>(b.hides(row_at(i))) << i;
        const uint32_t pattern = rows * kEveryKey;
#pragma unroll
        for (int w = 0; w < kWords; ++w) {
          const int lo = min(max(k0 - w * kKeysPerWord, 0), kKeysPerWord) * kRows;
          const int hi = min(max(k1 - w * kKeysPerWord, 0), kKeysPerWord) * kRows;
          words[w] |= pattern & (low_bits(hi) & ~low_bits(lo));
        }
      }
      k0 = k1;
    }
  }

  template <typename Keys, typename RowAt>
  __device__ __noinline__ void find_by_runs_call(const int4* record, const int4& runs, const Keys& keys, RowAt row_at,
                                                 int len_k) {
    find_by_runs(record, runs, keys, row_at, len_k);
  }

  template <typename Keys, typename RowAt>
  __device__ __noinline__ void find_by_keys_call(const FwdParams& p, const ColumnMaskView& mask, const Keys& keys,
                                                 RowAt row_at, int len_k) {
    find_by_keys<1>(p, mask, keys, row_at, len_k);
  }

  __device__ __forceinline__ bool hidden(int k, int r) const {
    return ((words[k / kKeysPerWord] >> (k % kKeysPerWord * kRows + r)) & 1u) != 0;
  }

 private:
  // Bits [0, n) of a word, n in [0, 32].
  __device__ __forceinline__ static uint32_t low_bits(int n) {
    return n >= kWordBits ? 0xffffffffu : (1u << n) - 1u;
  }
};

// The forward's S accumulators, mma.m16n8k16 C fragments (as apply_mask in common/mask.cuh):
// s[mt][nt][2 * h + e] is row row0 + 16 mt + 8 h, key block_first + col0 + 8 nt + e of key block
// `block` (block_first = block * the summary's block keys). Hidden scores become -inf.
template <bool kByCall, int kMTiles, int kNTiles>
__device__ __forceinline__ void hide_column_scores(float (&s)[kMTiles][kNTiles][4], const FwdParams& p,
                                                   const ColumnMaskView& mask, int block, int block_first, int row0,
                                                   int col0, int len_k) {
  constexpr int kTileRows = 16, kHalfRows = 8, kTileCols = 8, kColsPerTile = 2;
  // Key k is (nt, e) = (k / 2, k % 2), row r is (mt, h) = (r / 2, r % 2).
  const FragmentKeys<kColsPerTile, kTileCols, 1> keys{block_first, col0};
  auto row_at = [row0](int r) { return row0 + r / 2 * kTileRows + r % 2 * kHalfRows; };
  HiddenPairs<2 * kNTiles, 2 * kMTiles> pairs;
  pairs.template find<1, kByCall>(p, mask, block, keys, row_at, len_k);
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

  // The thread's keys are block_first + key0 + 16 mi + 8 (e / 2).
  __device__ __forceinline__ void find(const FwdParams& p, const ColumnMaskView& mask, int block, int block_first,
                                       int key0, int row0, int len_k) {
    // Key k is (mi, e / 2) = (k / 2, k % 2), row r is (j, e % 2) = (r / 2, r % 2).
    pairs.find(p, mask, block, FragmentKeys<2, kTileKeys, kHalfKeys>{block_first, key0},
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
