// The Hopper backward's dQ staging order (session 76), shared by the kernel (bwd_tile.h, which
// stores the staged rows), the host (tensor_map.cu, whose map reads them back) and a CPU test
// (tests/cpu/test_dq_rows.cpp, which walks the map's box as the TMA does).
//
// Each group of kDqRowGroup accumulator rows is staged interleaved: row r of a group in shared
// row dq_staged_row(r) = 2 (r % 4) + r / 4 (rows 0, 4, 1, 5, 2, 6, 3, 7 in turn). A warp stores
// one 8-byte accumulator pair per lane, each row's four lanes 32 bytes of a 128-byte row, and a
// half-warp holds rows 0-3 (or 4-7) of a group. Under the 128-byte swizzle (16-byte chunk c of
// row r at c ^ r % 8) rows r and r ^ 1 of the plain order fall on the same two chunks, so each
// half-warp's store took two shared wavefronts instead of one (ncu: 9% of the d128 kernel's
// wavefronts, 2-5% of its stall samples at full 2k); interleaved, a half-warp's rows sit at
// swizzle phases 0, 2, 4, 6 (or 1, 3, 5, 7). bwd_tile.h checks that with a static_assert.
#pragma once

#include <cstdint>

#include "fusedattn/params.h"  // FUSEDATTN_HD

namespace fusedattn::cuda::sm90 {

constexpr int kDqRowGroup = 8;                // the 128-byte swizzle's rows (bwd_tile.h asserts it)
constexpr int kDqRowQuad = kDqRowGroup / 2;  // rows r and r + kDqRowQuad of a group are staged side by side

// The shared row of accumulator row `row` (plain order where not interleaved).
FUSEDATTN_HD constexpr int dq_staged_row(int row, bool interleaved = true) {
  const int r = row % kDqRowGroup;
  return interleaved ? row - r + 2 * (r % kDqRowQuad) + r / kDqRowQuad : row;
}

// The interleaved workspace map (make_dq_tensor_map): `rows` rows of `cols` floats, `pitch`
// floats apart, as 4-D over (column, row / 4 % 2, row % 4, row / 8), innermost first, so the box's
// shared rows walk the global rows of each group as dq_staged_row placed them. Extents, strides
// of dims 1-3 (in floats) and the box; a box's coordinates are (column, 0, 0, first row / 8).
struct DqMapShape {
  int64_t dims[4];
  int64_t strides[3];
  int box[4];
};
constexpr DqMapShape dq_interleaved_map_shape(int64_t cols, int64_t rows, int64_t pitch, int box_cols, int box_rows) {
  constexpr int kHalves = kDqRowGroup / kDqRowQuad;
  return {{cols, kHalves, kDqRowQuad, rows / kDqRowGroup},
          {kDqRowQuad * pitch, pitch, kDqRowGroup * pitch},
          {box_cols, kHalves, kDqRowQuad, box_rows / kDqRowGroup}};
}

}  // namespace fusedattn::cuda::sm90
