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

// The summary of one call's mask, as the kernels take it. bounds: [batch][mask heads][blocks]
// [kColumnSummaryIntervals] int4 of (least start, greatest start, least end, greatest end).
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

}  // namespace fusedattn::cuda
