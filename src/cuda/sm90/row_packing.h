// GQA packing's row rule, one definition for the host plan and the kernel: a tile head packs the
// 2^shift query heads that share one KV head, position-major, so tiled row r of tile head th is
// query position r >> shift of query head (th << shift) + r % 2^shift. Unpacked, shift = 0
// (fwd_split.h decides per launch whether to pack).
#pragma once

#include <cstdint>

#include "fusedattn/params.h"

namespace fusedattn::cuda::sm90 {

// Where a tiled row lands: its query head and its row in the output's sequence dimension.
struct QueryRow {
  int64_t head;
  int64_t position;
};

struct RowPacking {
  int shift;  // log2 of the query heads a tile head packs

  FUSEDATTN_HD int position(int row) const { return row >> shift; }
  FUSEDATTN_HD int64_t position(int64_t row) const { return row >> shift; }
  // Tiled rows per (tile head, batch) pair.
  FUSEDATTN_HD int64_t rows(int64_t seqlen_q) const { return seqlen_q << shift; }
  FUSEDATTN_HD int tile_heads(int heads_q) const { return heads_q >> shift; }
  FUSEDATTN_HD int64_t query_head(int64_t tile_head, int64_t row) const {
    return (tile_head << shift) + (row & ((int64_t{1} << shift) - 1));
  }
  // Tiled row `row` of tile head `tile_head`, in a tile whose sequence starts at row q_start of
  // the output (a variable-length batch's packed rows; 0 otherwise).
  FUSEDATTN_HD QueryRow query_row(int64_t tile_head, int64_t q_start, int64_t row) const {
    return {query_head(tile_head, row), q_start + position(row)};
  }
};

}  // namespace fusedattn::cuda::sm90
