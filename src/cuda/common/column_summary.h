// The per-key-block summary of a column mask, written by a small kernel (column_summary.cu)
// before the attention kernel of a column-masked call, and the rules by which the kernels read it
// (common/column_mask.cuh applies them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/params.h"

namespace fusedattn::cuda {

// Every summary holds two intervals per block; a mask of one interval has an empty second.
constexpr int kColumnSummaryIntervals = 2;
// Key blocks are at least this many keys (one m16 tile); the backward sizes its summary by it.
constexpr int kColumnSummaryMinBlockKeys = 16;

// A block's keys in runs of equal bounds (documents: a run per document the block meets), so that
// a block the mask cuts can be masked run by run rather than key by key (common/column_mask.cuh).
// Up to kColumnRunsMax runs are kept; a block with more (bounds that change from key to key: windows,
// prefixes) is masked key by key. A run's end is kept in a byte, in keys after the block's first.
constexpr int kColumnRunsMax = 8;
constexpr int kColumnRunEndBits = 8;
constexpr int kColumnRunEndsPerWord = 32 / kColumnRunEndBits;
constexpr int kColumnSummaryMaxBlockKeys = (1 << kColumnRunEndBits) - 1;
// A block's record, in int4: its bounds (one per interval), the runs' header (x: how many runs, 0
// where there are more than kColumnRunsMax; y, z: their ends, run r's in byte r % 4 of y for r < 4
// and of z after), then each run's bounds (s0, e0, s1, e1; an empty interval as 0, 0).
constexpr int kColumnRunsHeader = kColumnSummaryIntervals;
constexpr int kColumnRunBounds = kColumnRunsHeader + 1;
constexpr int kColumnSummaryStride = kColumnRunBounds + kColumnRunsMax;
static_assert(kColumnRunsMax <= 2 * kColumnRunEndsPerWord, "the run ends fit in the header's y and z");

// The end of run r of a block (keys after its first) from its runs' header.
FUSEDATTN_HD int column_run_end(const int4& header, int r) {
  const unsigned word = static_cast<unsigned>(r < kColumnRunEndsPerWord ? header.y : header.z);
  constexpr unsigned kByte = (1u << kColumnRunEndBits) - 1;
  return static_cast<int>((word >> (r % kColumnRunEndsPerWord * kColumnRunEndBits)) & kByte);
}

// Where one thread's keys of a key block lie in its accumulator fragment: key k is
// block_first + offset + (k / kPerStep) * kStep + (k % kPerStep) * kSpacing. A run of keys
// [block_first + a, block_first + b) holds the thread's keys [count_before(a), count_before(b)).
template <int kPerStep, int kStep, int kSpacing>
struct FragmentKeys {
  static_assert(kPerStep * kSpacing <= kStep, "a step's keys lie before the next step's");
  int block_first;  // the block's first key
  int offset;       // the thread's first key, after block_first

  FUSEDATTN_HD int key(int k) const { return block_first + offset + k / kPerStep * kStep + k % kPerStep * kSpacing; }
  // How many of the thread's keys lie before key block_first + end (not capped at its key count).
  FUSEDATTN_HD int count_before(int end) const {
    const int t = end - offset;
    if (t <= 0) return 0;
    const int in_step = (t % kStep + kSpacing - 1) / kSpacing;
    return t / kStep * kPerStep + (in_step < kPerStep ? in_step : kPerStep);
  }
};

// The summary of one call's mask, as the kernels take it. bounds: [batch][mask heads][blocks]
// [kColumnSummaryStride] int4: each block's record, whose first kColumnSummaryIntervals int4 are
// (least start, greatest start, least end, greatest end) of each interval.
struct ColumnSummary {
  const int4* bounds = nullptr;
  int blocks = 0;  // key blocks per (batch, mask head)
};

// How the kernels read one block's summary (host and device, so the tests can check the rules
// by brute force). A block of rows [r0, r1) is
//   hidden by interval i   when every key's interval covers the rows: greatest start <= r0 and
//                          least end >= r1;
//   untouched by it        when no key's interval reaches them: least start >= r1 or greatest
//                          end <= r0;
// and cut (masked element-wise) otherwise. A key whose interval is empty (start >= end) enters the
// summary as start = INT_MAX, end = INT_MIN, so it neither hides a block nor cuts it. Rows hidden
// only by the union of a key's two intervals count as cut: exact, only not skipped.
struct ColumnCover {
  bool seen, cut;
};

FUSEDATTN_HD ColumnCover column_cover(const int4* block, int r0, int r1) {
  bool hidden = false, untouched = true;
  for (int i = 0; i < kColumnSummaryIntervals; ++i) {
    const int4 b = block[i];
    hidden = hidden || (b.y <= r0 && b.z >= r1);
    untouched = untouched && (b.x >= r1 || b.w <= r0);
  }
  return {!hidden, !untouched};
}

// Query rows [first, end) of [0, len_q): outside them every key of a block hides from every row,
// by intervals that reach an end of the sequence (documents: the rows after the block's
// document). Empty (first >= end) when every row is hidden.
struct RowSpan {
  int first, end;
};

FUSEDATTN_HD RowSpan column_seen_rows(const int4* block, int len_q) {
  RowSpan seen{0, len_q};
  // Every key hides rows [greatest start, least end) of an interval, where that is not empty;
  // twice over the intervals, so that one reaching the other's edge counts in either order.
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < kColumnSummaryIntervals; ++i) {
      const int4 b = block[i];
      if (b.y >= b.z) continue;
      if (b.z >= seen.end && b.y < seen.end) seen.end = b.y > seen.first ? b.y : seen.first;
      if (b.y <= seen.first && b.z > seen.first) seen.first = b.z < seen.end ? b.z : seen.end;
    }
  return seen;
}

// Bytes of the summary of p's column mask over key blocks of block_keys keys.
int64_t column_summary_bytes(const FwdParams& p, int block_keys);

// Writes that summary into `bounds` (column_summary_bytes of device memory) on p.stream.
ColumnSummary summarize_column_mask(const FwdParams& p, int block_keys, int4* bounds);

// Whether the spans of rows that a mask head's key blocks may be seen by (column_seen_rows) are
// none of them empty and both their ends grow (never fall) with the block: documents, windows
// written as columns. Then so do the spans of any group of mask heads (their unions), and the
// backward's deterministic mode may leave the query blocks outside them out (sm80/bwd_column_spans.cuh).
// Kept in the runs' header of the head's block 0 (its w, which the summary leaves 0), written by
// mark_growing_spans into the summary `bounds` of `blocks` key blocks (summarize_column_mask's),
// on p.stream; read by column_spans_grow.
void mark_growing_spans(const FwdParams& p, int4* bounds, int blocks);

// A mask head's mark: head_blocks is its block 0's record.
FUSEDATTN_HD bool column_spans_grow(const int4* head_blocks) { return head_blocks[kColumnRunsHeader].w != 0; }

}  // namespace fusedattn::cuda
