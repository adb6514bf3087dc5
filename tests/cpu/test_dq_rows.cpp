// The Hopper backward's dQ staging order (src/cuda/sm90/dq_rows.h): the kernel stages accumulator
// row r of each 8-row group in shared row dq_staged_row(r), and the workspace's tensor map must
// read every staged row back to its own global row. Checked here without a GPU by walking the
// map's box as the TMA does (innermost dimension first, each box element at its coordinates times
// the strides).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "cuda/sm90/dq_rows.h"

namespace fusedattn::cuda::sm90 {
namespace {

// Within each group the order is a permutation that keeps the group, and the plain order is
// the identity.
TEST(DqRows, InterleaveIsAPermutationOfEachGroup) {
  for (int group = 0; group < 4; ++group) {
    std::set<int> seen;
    for (int r = group * kDqRowGroup; r < (group + 1) * kDqRowGroup; ++r) {
      const int s = dq_staged_row(r);
      EXPECT_EQ(s / kDqRowGroup, group) << r;
      seen.insert(s);
      EXPECT_EQ(dq_staged_row(r, false), r);
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(kDqRowGroup));
  }
  // Rows 0-3 of a group (one half-warp's) take every other shared row.
  EXPECT_EQ(dq_staged_row(0), 0);
  EXPECT_EQ(dq_staged_row(1), 2);
  EXPECT_EQ(dq_staged_row(4), 1);
  EXPECT_EQ(dq_staged_row(11), 8 + 6);
}

// Every element of a box, read from shared memory in the TMA's order, lands on the global
// (row, column) whose accumulator the kernel staged there: shared row dq_staged_row(row - first
// row), column of the box.
TEST(DqRows, MapReadsEachStagedRowBackToItsRow) {
  constexpr int64_t kCols = 128, kRows = 3 * 256, kPitch = 136;  // a pitch past the columns, as rounded
  constexpr int kBoxCols = 32, kBoxRows = 64;
  constexpr DqMapShape m = dq_interleaved_map_shape(kCols, kRows, kPitch, kBoxCols, kBoxRows);
  static_assert(m.dims[1] * m.dims[2] * m.dims[3] == kRows && m.box[1] * m.box[2] * m.box[3] == kBoxRows);
  for (const int64_t first_row : {int64_t{0}, int64_t{64}, int64_t{2 * 256 + 128}}) {
    for (const int64_t first_col : {int64_t{0}, int64_t{96}}) {
      const int64_t start[4] = {first_col, 0, 0, first_row / kDqRowGroup};
      int64_t shared_index = 0;
      for (int i3 = 0; i3 < m.box[3]; ++i3)
        for (int i2 = 0; i2 < m.box[2]; ++i2)
          for (int i1 = 0; i1 < m.box[1]; ++i1)
            for (int i0 = 0; i0 < m.box[0]; ++i0, ++shared_index) {
              const int64_t at = (start[0] + i0) + (start[1] + i1) * m.strides[0] + (start[2] + i2) * m.strides[1] +
                                 (start[3] + i3) * m.strides[2];
              const int64_t row = at / kPitch, col = at % kPitch;
              ASSERT_EQ(col, first_col + shared_index % kBoxCols);
              ASSERT_GE(row, first_row);
              ASSERT_LT(row, first_row + kBoxRows);
              ASSERT_EQ(dq_staged_row(static_cast<int>(row - first_row)), shared_index / kBoxCols)
                  << "first row " << first_row << ", global row " << row;
            }
    }
  }
}

}  // namespace
}  // namespace fusedattn::cuda::sm90
