// src/api/overlap.h: whether two strided views share a byte. Random small views against an
// enumeration of their bytes, the packed layouts a framework makes (apart byte for byte, though
// their address ranges interleave), views that reach past the address space, and the search's
// honest "undecided".
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "api/overlap.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

using detail::bytes_of;
using detail::Overlap;
using detail::overlap;

// A view at byte `offset` of a buffer that starts at `base`.
TensorView view_at(unsigned char* base, int64_t offset, DType dtype, std::initializer_list<int64_t> shape,
                   std::initializer_list<int64_t> stride) {
  TensorView t = TensorView::contiguous(base + offset, dtype, shape);
  std::copy(stride.begin(), stride.end(), t.stride);
  return t;
}

// The bytes of a view, as offsets from `base`, marked in a map of `arena` bytes.
std::vector<bool> bytes_marked(const TensorView& t, const unsigned char* base, size_t arena) {
  std::vector<bool> mark(arena, false);
  int64_t count = 1;
  for (int d = 0; d < t.rank; ++d) count *= t.shape[d];
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t rest = flat, offset = static_cast<const unsigned char*>(t.data) - base;
    for (int d = t.rank - 1; d >= 0; --d) {
      offset += (rest % t.shape[d]) * t.stride[d] * elem;
      rest /= t.shape[d];
    }
    for (int64_t b = 0; b < elem; ++b) mark.at(static_cast<size_t>(offset + b)) = true;
  }
  return mark;
}

// Views of rank 1-4 with sizes 0-4, strides of -9 to 9 elements (expanded, nested, interleaved,
// self-overlapping and mirrored ones alike; validation turns negative strides down, the check
// takes them anyway) and elements of 1, 2 and 4 bytes, their lowest byte anywhere in the first 48
// of an arena that holds them all: the answer must be the enumeration's, never "undecided".
TEST(Overlap, RandomSmallViewsMatchAnEnumerationOfTheirBytes) {
  constexpr int64_t kMaxSize = 4, kMaxStride = 9, kStart = 48;
  constexpr int64_t kReach = kMaxRank * (kMaxSize - 1) * kMaxStride * 4;  // bytes each way, at most
  constexpr size_t kArena = kStart + 2 * kReach + 4;
  std::vector<unsigned char> arena(kArena);
  std::mt19937_64 rng = fresh_rng();
  const DType dtypes[] = {DType::kFloat8E4M3, DType::kFloat16, DType::kFloat32};
  const auto random_view = [&] {
    TensorView t;
    t.dtype = dtypes[rng() % 3];
    t.rank = 1 + static_cast<int>(rng() % kMaxRank);
    int64_t first = static_cast<int64_t>(rng() % kStart);  // the lowest byte
    for (int d = 0; d < t.rank; ++d) {
      t.shape[d] = rng() % 16 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % kMaxSize);
      t.stride[d] = static_cast<int64_t>(rng() % (2 * kMaxStride + 1)) - kMaxStride;
      if (t.stride[d] < 0 && t.shape[d] > 1)
        first -= t.stride[d] * (t.shape[d] - 1) * static_cast<int64_t>(dtype_size(t.dtype));
    }
    t.data = arena.data() + first;
    return t;
  };
  int shared = 0, apart = 0;
  for (int i = 0; i < 20000; ++i) {
    const TensorView a = random_view(), b = random_view();
    const std::vector<bool> in_a = bytes_marked(a, arena.data(), kArena), in_b = bytes_marked(b, arena.data(), kArena);
    bool common = false;
    for (size_t x = 0; x < kArena; ++x) common = common || (in_a[x] && in_b[x]);
    const Overlap got = overlap(bytes_of(a), bytes_of(b));
    ASSERT_EQ(got, common ? Overlap::kShared : Overlap::kApart) << "pair " << i;
    ASSERT_EQ(overlap(bytes_of(b), bytes_of(a)), got) << "pair " << i << " swapped";
    (common ? shared : apart) += 1;
  }
  // Both answers are common, so neither can pass by always being given.
  EXPECT_GT(shared, 4000);
  EXPECT_GT(apart, 4000);
}

// q, k and v (or dq, dk and dv) of one packed [B, S, 3, H, D] buffer, and of a GQA-packed
// [B, S, Hq + 2 Hkv, D] one with a single KV head (whose head dimension is then no dimension):
// their address ranges interleave, their bytes do not. One element further, they meet.
TEST(Overlap, PackedQkvViewsAreApart) {
  std::vector<unsigned char> buffer(1 << 16);
  unsigned char* base = buffer.data();
  constexpr int64_t B = 2, S = 5, H = 4, D = 8;
  const auto slot = [&](int64_t i, int64_t shift = 0) {
    return view_at(base, (i * H * D + shift) * 2, DType::kFloat16, {B, S, H, D}, {S * 3 * H * D, 3 * H * D, D, 1});
  };
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(overlap(bytes_of(slot(i)), bytes_of(slot(j))), i == j ? Overlap::kShared : Overlap::kApart)
          << i << " " << j;
  EXPECT_EQ(overlap(bytes_of(slot(0)), bytes_of(slot(1, -1))), Overlap::kShared);
  EXPECT_EQ(overlap(bytes_of(slot(2)), bytes_of(slot(1, 1))), Overlap::kShared);

  constexpr int64_t Hq = 6, Hkv = 1, W = Hq + 2 * Hkv;
  const TensorView q = view_at(base, 0, DType::kBFloat16, {B, S, Hq, D}, {S * W * D, W * D, D, 1});
  const TensorView k = view_at(base, Hq * D * 2, DType::kBFloat16, {B, S, Hkv, D}, {S * W * D, W * D, D, 1});
  const TensorView v = view_at(base, (Hq + 1) * D * 2, DType::kBFloat16, {B, S, Hkv, D}, {S * W * D, W * D, D, 1});
  EXPECT_EQ(overlap(bytes_of(q), bytes_of(k)), Overlap::kApart);
  EXPECT_EQ(overlap(bytes_of(q), bytes_of(v)), Overlap::kApart);
  EXPECT_EQ(overlap(bytes_of(k), bytes_of(v)), Overlap::kApart);
  TensorView wide_k = k;
  wide_k.shape[3] = D + 1;  // its rows' last element is v's first
  EXPECT_EQ(overlap(bytes_of(wide_k), bytes_of(v)), Overlap::kShared);
}

// An output written as [B, H, S, D] over the memory of a [B, S, H, D] input: the case that gave a
// wrong answer on the CPU. A contiguous range (a workspace) meets a view inside it, not one that
// starts where it ends.
TEST(Overlap, TransposedViewsAndByteRanges) {
  std::vector<unsigned char> buffer(4096);
  unsigned char* base = buffer.data();
  const TensorView bshd = view_at(base, 0, DType::kFloat32, {1, 6, 4, 8}, {192, 32, 8, 1});
  const TensorView bhsd_as_bshd = view_at(base, 0, DType::kFloat32, {1, 6, 4, 8}, {192, 8, 48, 1});
  EXPECT_EQ(overlap(bytes_of(bshd), bytes_of(bhsd_as_bshd)), Overlap::kShared);
  EXPECT_EQ(overlap(bytes_of(base + 100, 8), bytes_of(bshd)), Overlap::kShared);
  EXPECT_EQ(overlap(bytes_of(base + 192 * 4, 64), bytes_of(bshd)), Overlap::kApart);
  EXPECT_EQ(overlap(bytes_of(base + 192 * 4 - 1, 64), bytes_of(bshd)), Overlap::kShared);
  EXPECT_EQ(overlap(bytes_of(base, 0), bytes_of(bshd)), Overlap::kApart);  // no workspace
  EXPECT_EQ(overlap(bytes_of(TensorView{}), bytes_of(bshd)), Overlap::kApart);  // not given
}

// Strides no buffer can hold, and views whose bytes interleave so finely that the search gives
// up: both "undecided", which validation reports as "may share memory".
TEST(Overlap, UndecidedWhereTheSearchCannotSettleIt) {
  std::vector<unsigned char> buffer(64);
  unsigned char* base = buffer.data();
  const TensorView huge = view_at(base, 0, DType::kFloat32, {1 << 20, 1 << 20}, {int64_t{1} << 45, 1});
  const TensorView small = view_at(base, 0, DType::kFloat32, {4}, {1});
  EXPECT_EQ(overlap(bytes_of(huge), bytes_of(small)), Overlap::kUndecided);
  // Even bytes and odd bytes, each placed by strides 6 and 4 over 10^5 steps: apart, but the
  // strides do not nest, so the search would try ~10^5 candidates at its first level.
  const TensorView even = view_at(base, 0, DType::kFloat8E4M3, {100000, 100000}, {6, 4});
  const TensorView odd = view_at(base, 1, DType::kFloat8E4M3, {100000, 100000}, {6, 4});
  EXPECT_EQ(overlap(bytes_of(even), bytes_of(odd)), Overlap::kUndecided);
  // At 10^3 steps it settles: apart.
  const TensorView even_short = view_at(base, 0, DType::kFloat8E4M3, {1000, 1000}, {6, 4});
  const TensorView odd_short = view_at(base, 1, DType::kFloat8E4M3, {1000, 1000}, {6, 4});
  EXPECT_EQ(overlap(bytes_of(even_short), bytes_of(odd_short)), Overlap::kApart);
}

}  // namespace
}  // namespace fusedattn::testing
