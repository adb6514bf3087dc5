// Which keys a block of query rows may see. Everything derives from key_range() in params.h, the
// one rule all backends share: per query row the visible keys form one interval [lo, hi], and
// both ends are non-decreasing in the row index. So a query block [r0, r_last] sees at most
// [lo(r0), hi(r_last)], and a key tile is "full" (needs no element-wise masking) exactly when
// lo(r_last) <= its first key and hi(r0) >= its last key.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/isa.h"
#include "fusedattn/params.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// Columns [begin, end) of a key tile that one query row may see; begin == end when none.
struct ColRange {
  int begin, end;
  bool empty() const { return begin >= end; }
};

// The union of the keys rows [r0, r0 + rows) may see; empty (lo > hi) when all are masked.
inline KeyRange block_key_range(const FwdParams& p, int64_t r0, int rows, int64_t len_q, int64_t len_k) {
  return {key_range(p, r0, len_q, len_k).lo, key_range(p, r0 + rows - 1, len_q, len_k).hi};
}

// Per-row visible columns of the key tile [c0, c0 + cols) for query rows [r0, r0 + rows).
// Interior tiles take the fast path; only tiles cut by a mask edge evaluate each row.
inline void tile_col_ranges(const FwdParams& p, int64_t r0, int rows, int64_t len_q, int64_t len_k, int64_t c0,
                            int cols, ColRange* ranges) {
  const int64_t c_last = c0 + cols - 1;
  const bool full = key_range(p, r0 + rows - 1, len_q, len_k).lo <= c0 && key_range(p, r0, len_q, len_k).hi >= c_last;
  if (full) {
    std::fill(ranges, ranges + rows, ColRange{0, cols});
    return;
  }
  for (int r = 0; r < rows; ++r) {
    const KeyRange kr = key_range(p, r0 + r, len_q, len_k);
    const int64_t lo = std::max(kr.lo, c0), hi = std::min(kr.hi, c_last);
    ranges[r] = lo <= hi ? ColRange{static_cast<int>(lo - c0), static_cast<int>(hi - c0 + 1)} : ColRange{0, 0};
  }
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
