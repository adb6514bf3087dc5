// api/zero_runs.h: a written tensor's bytes as 2-D memset blocks. Applied to a buffer of 0xFF bytes
// the runs must clear exactly the view's elements; the CUDA backend issues the same runs as
// cudaMemset2DAsync calls, so these cases are its layouts too.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "api/zero_runs.h"

namespace fusedattn::testing {
namespace {

using detail::ZeroRuns;

constexpr unsigned char kUntouched = 0xFF;

struct Layout {
  const char* name;
  std::vector<int64_t> shape, stride;
  DType dtype = DType::kFloat16;
};

// Clears `l`'s elements of a buffer by its runs and checks every byte: 0 inside an element, else
// untouched. Returns the runs.
ZeroRuns expect_exact_zeroing(const Layout& l) {
  SCOPED_TRACE(l.name);
  TensorView t;
  t.dtype = l.dtype;
  t.rank = static_cast<int>(l.shape.size());
  int64_t span = 1;  // elements the buffer needs: one past the last element's offset
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = l.shape[d];
    t.stride[d] = l.stride[d];
    if (l.shape[d] > 0) span += (l.shape[d] - 1) * l.stride[d];
  }
  const auto element = static_cast<int64_t>(dtype_size(t.dtype));
  std::vector<unsigned char> buffer(static_cast<size_t>(span * element + 64), kUntouched);
  t.data = buffer.data();
  const ZeroRuns runs = detail::zero_runs(t);
  runs.for_each_block([&](int64_t offset) {
    for (int64_t run = 0; run < runs.height; ++run) {
      EXPECT_LE(offset + run * runs.pitch + runs.width, static_cast<int64_t>(buffer.size()));
      std::memset(buffer.data() + offset + run * runs.pitch, 0, static_cast<size_t>(runs.width));
    }
  });
  std::vector<bool> inside(buffer.size(), false);
  for (int64_t e = 0, count = t.numel(); e < count; ++e) {
    int64_t offset = 0, rest = e;
    for (int d = t.rank - 1; d >= 0; --d) {
      offset += rest % t.shape[d] * t.stride[d];
      rest /= t.shape[d];
    }
    for (int64_t b = 0; b < element; ++b) inside[static_cast<size_t>(offset * element + b)] = true;
  }
  int64_t wrong = 0, first_wrong = -1;
  for (size_t b = 0; b < buffer.size(); ++b)
    if (buffer[b] != (inside[b] ? 0 : kUntouched) && wrong++ == 0) first_wrong = static_cast<int64_t>(b);
  EXPECT_EQ(wrong, 0) << "bytes wrong, the first at " << first_wrong
                      << (first_wrong >= 0 && inside[static_cast<size_t>(first_wrong)] ? " (an element left)" : " (outside, cleared)");
  return runs;
}

TEST(ZeroRuns, ContiguousIsOneRun) {
  const ZeroRuns r = expect_exact_zeroing({"contiguous [2, 5, 3, 8]", {2, 5, 3, 8}, {120, 24, 8, 1}});
  EXPECT_EQ(r.width, 240 * 2);
  EXPECT_EQ(r.height, 1);
  EXPECT_EQ(r.outer_dims, 0);
}

TEST(ZeroRuns, TransposedLayoutIsOneRun) {
  // [B, S, H, D] strides of a [B, H, S, D] buffer: dense, so still one run.
  const ZeroRuns r = expect_exact_zeroing({"bhsd [2, 5, 3, 8]", {2, 5, 3, 8}, {120, 8, 40, 1}, DType::kFloat32});
  EXPECT_EQ(r.height, 1);
  EXPECT_EQ(r.outer_dims, 0);
}

TEST(ZeroRuns, PaddedRowsAreOneBlock) {
  const ZeroRuns r = expect_exact_zeroing({"rows padded to 11 [2, 5, 3, 8]", {2, 5, 3, 8}, {165, 33, 11, 1}});
  EXPECT_EQ(r.width, 8 * 2);
  EXPECT_EQ(r.pitch, 11 * 2);
  EXPECT_EQ(r.height, 30);
  EXPECT_EQ(r.outer_dims, 0);
}

TEST(ZeroRuns, StridedPositionsAreOneBlock) {
  // Every second position of a [2, 10, 3, 8] buffer.
  const ZeroRuns r = expect_exact_zeroing({"every second position", {2, 5, 3, 8}, {240, 48, 8, 1}, DType::kBFloat16});
  EXPECT_EQ(r.width, 24 * 2);
  EXPECT_EQ(r.outer_dims, 0);
}

TEST(ZeroRuns, OtherGapsRepeatTheBlock) {
  // Padded rows inside a batch dimension with a gap of its own: the batch repeats the block.
  const ZeroRuns r = expect_exact_zeroing({"padded rows, gapped batch", {3, 5, 2, 8}, {400, 24, 12, 1}});
  EXPECT_EQ(r.height, 10);
  EXPECT_EQ(r.outer_dims, 1);
  expect_exact_zeroing({"two gaps", {3, 4, 2, 8}, {300, 70, 20, 1}});
  expect_exact_zeroing({"varlen rows, padded heads", {7, 3, 8}, {40, 12, 1}, DType::kFloat32});
}

TEST(ZeroRuns, SizeOneAndEmptyDimensions) {
  expect_exact_zeroing({"size-1 dims with any stride", {1, 6, 1, 8}, {999, 8, 777, 1}});
  expect_exact_zeroing({"head dim 1", {2, 3, 4, 1}, {12, 4, 1, 1}});
  expect_exact_zeroing({"one element", {1, 1, 1, 1}, {0, 0, 0, 1}});
  const ZeroRuns r = expect_exact_zeroing({"no elements", {2, 0, 3, 8}, {0, 24, 8, 1}});
  EXPECT_EQ(r.width, 0);
  int blocks = 0;
  r.for_each_block([&](int64_t) { ++blocks; });
  EXPECT_EQ(blocks, 0);
}

}  // namespace
}  // namespace fusedattn::testing
