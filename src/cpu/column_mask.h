// Column-sparse masks (Options::column_mask, FlashMask's representation) on the CPU backend: each
// key hides itself from up to two intervals of query rows. A (query block, key tile) pair is
// classified from those intervals before any product: a tile no row of the block can see is
// skipped, one the intervals do not touch runs as usual, and only the rest get their hidden
// scores set to -inf (the online softmax and the backward's exp2 turn -inf into p = 0).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/isa.h"
#include "cpu/softmax.h"
#include "fusedattn/params.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

enum class TileCover { kNone, kPartial, kAll };

class ColumnMask {
 public:
  // The mask of batch b and query head h (the shared mask head when it has one); none when the
  // call has no column mask.
  ColumnMask(const FwdParams& p, int b, int h) {
    if (p.column_mask == nullptr) return;
    keys_ = column_mask_keys(p, b, h);
    key_stride_ = p.column_mask_stride.row;
    intervals_ = p.column_mask_intervals;
  }

  // How much of query rows [r0, r0 + rows) x keys [c0, c0 + cols) the intervals hide.
  TileCover cover(int64_t r0, int rows, int64_t c0, int cols) const {
    if (keys_ == nullptr) return TileCover::kNone;
    const int64_t r_end = r0 + rows;
    bool all = true, none = true;
    for (int c = 0; c < cols; ++c) {
      const int32_t* m = keys_ + (c0 + c) * key_stride_;
      // Walk the hidden rows from r0: twice over the intervals, so either order is followed.
      int64_t next = r0;
      for (int pass = 0; pass < 2; ++pass)
        for (int i = 0; i < intervals_; ++i)
          if (m[2 * i] <= next && next < m[2 * i + 1]) next = m[2 * i + 1];
      all = all && next >= r_end;
      for (int i = 0; i < intervals_; ++i)
        none = none && (m[2 * i] >= m[2 * i + 1] || m[2 * i + 1] <= r0 || m[2 * i] >= r_end);
      if (!all && !none) return TileCover::kPartial;
    }
    return all ? TileCover::kAll : (none ? TileCover::kNone : TileCover::kPartial);
  }

  // Scores s[r * ld + c] of the tile's hidden (row, key) pairs set to -inf.
  void hide(int64_t r0, int rows, int64_t c0, int cols, float* s, int ld) const {
    for (int c = 0; c < cols; ++c) {
      const int32_t* m = keys_ + (c0 + c) * key_stride_;
      for (int i = 0; i < intervals_; ++i) {
        const int64_t lo = std::max<int64_t>(m[2 * i], r0), hi = std::min<int64_t>(m[2 * i + 1], r0 + rows);
        for (int64_t r = lo; r < hi; ++r) s[(r - r0) * ld + c] = kNegInf;
      }
    }
  }

 private:
  const int32_t* keys_ = nullptr;  // key 0's entries; key j's start j * key_stride_ later
  int64_t key_stride_ = 0;
  int intervals_ = 0;
};

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
