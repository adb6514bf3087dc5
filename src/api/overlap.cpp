#include "api/overlap.h"

#include <algorithm>
#include <cstdint>

namespace fusedattn::detail {
namespace {

// A 64-bit address space: a view that reaches past it is not memory (validation bounds no
// stride or size), and bounding reaches by it keeps every sum below within ByteCount.
constexpr ByteCount kAddressSpace = ByteCount{1} << 64;

// Steps the search may take before it gives up. Where both views' strides nest (each stepping past
// the reach of the smaller ones: every framework's views, and every written tensor validation
// accepts) a level leaves a few candidates at most, and the packed layouts of the tests take a few
// dozen steps in all; only strides that interleave finely over long dimensions reach the limit.
constexpr long kSearchSteps = 1 << 14;

// The bytes from a view's base that its last element ends at, or kAddressSpace + 1 past it.
ByteCount reach_of(const ByteView& v) {
  constexpr ByteCount kPast = kAddressSpace + 1;
  ByteCount reach = v.element_bytes;
  for (int d = 0; d < v.dims; ++d) {
    if (v.stride[d] > kAddressSpace || v.size[d] - 1 > kAddressSpace / v.stride[d]) return kPast;
    reach += v.stride[d] * (v.size[d] - 1);
  }
  return reach > kAddressSpace ? kPast : reach;
}

ByteCount floor_div(ByteCount x, ByteCount d) {  // d > 0
  const ByteCount q = x / d;
  return (x % d != 0 && x < 0) ? q - 1 : q;
}
ByteCount ceil_div(ByteCount x, ByteCount d) { return -floor_div(-x, d); }

// An element of a at byte A + sum_k i_k s_k and one of b at B + sum_k j_k s_k share a byte when
// (B - A) + sum_k e_k s_k, with e_k = j_k - i_k, lies within (-b.element_bytes, a.element_bytes).
// One level per distinct stride s_k of either view (a view's dimensions of equal stride add
// their steps; one without that stride has none), largest first, each bounding e_k to
// [-a_steps, b_steps].
struct Level {
  ByteCount stride = 0;
  ByteCount a_steps = 0;
  ByteCount b_steps = 0;
};

class SharedByteSearch {
 public:
  SharedByteSearch(const ByteView& a, const ByteView& b) {
    add(a, &Level::a_steps);
    add(b, &Level::b_steps);
    std::sort(level_, level_ + levels_, [](const Level& x, const Level& y) { return x.stride > y.stride; });
    least_[levels_] = most_[levels_] = 0;
    for (int i = levels_ - 1; i >= 0; --i) {
      least_[i] = least_[i + 1] - level_[i].a_steps * level_[i].stride;
      most_[i] = most_[i + 1] + level_[i].b_steps * level_[i].stride;
    }
  }

  // Whether the levels from i on can sum into [lo, hi], depth first.
  Overlap find(int i, ByteCount lo, ByteCount hi) {
    if (i == levels_) return lo <= 0 && 0 <= hi ? Overlap::kShared : Overlap::kApart;
    const Level& l = level_[i];
    // The levels after this one add a sum within [least_[i + 1], most_[i + 1]].
    const ByteCount first = std::max(-l.a_steps, ceil_div(lo - most_[i + 1], l.stride));
    const ByteCount last = std::min(l.b_steps, floor_div(hi - least_[i + 1], l.stride));
    for (ByteCount e = first; e <= last; ++e) {
      if (--steps_left_ < 0) return Overlap::kUndecided;
      const Overlap found = find(i + 1, lo - e * l.stride, hi - e * l.stride);
      if (found != Overlap::kApart) return found;
    }
    return Overlap::kApart;
  }

 private:
  void add(const ByteView& v, ByteCount Level::*steps) {
    for (int d = 0; d < v.dims; ++d) {
      Level* l = std::find_if(level_, level_ + levels_, [&](const Level& x) { return x.stride == v.stride[d]; });
      if (l == level_ + levels_) {
        *l = Level{};
        l->stride = v.stride[d];
        ++levels_;
      }
      l->*steps += v.size[d] - 1;
    }
  }

  static constexpr int kMaxLevels = 2 * kMaxRank;
  Level level_[kMaxLevels];
  int levels_ = 0;
  ByteCount least_[kMaxLevels + 1] = {};  // the least sum the levels from i on reach
  ByteCount most_[kMaxLevels + 1] = {};   // and the greatest
  long steps_left_ = kSearchSteps;
};

ByteCount address_of(const void* p) { return static_cast<ByteCount>(reinterpret_cast<std::uintptr_t>(p)); }

}  // namespace

ByteView bytes_of(const TensorView& t) {
  ByteView v;
  v.address = address_of(t.data);
  v.element_bytes = static_cast<ByteCount>(dtype_size(t.dtype));
  v.empty = t.data == nullptr;
  for (int d = 0; d < std::min(t.rank, kMaxRank); ++d) {
    if (t.shape[d] == 0) v.empty = true;
    if (t.shape[d] <= 1 || t.stride[d] == 0) continue;
    ByteCount stride = static_cast<ByteCount>(t.stride[d]) * v.element_bytes;
    if (stride < 0) {  // its last element comes first
      stride = -stride;
      v.address -= stride * (t.shape[d] - 1);
    }
    v.stride[v.dims] = stride;
    v.size[v.dims] = t.shape[d];
    ++v.dims;
  }
  return v;
}

ByteView bytes_of(const void* data, std::size_t bytes) {
  ByteView v;
  v.address = address_of(data);
  v.element_bytes = static_cast<ByteCount>(bytes);
  v.empty = data == nullptr || bytes == 0;
  return v;
}

Overlap overlap(const ByteView& a, const ByteView& b) {
  if (a.empty || b.empty) return Overlap::kApart;
  const ByteCount a_reach = reach_of(a), b_reach = reach_of(b);
  if (a_reach > kAddressSpace || b_reach > kAddressSpace) return Overlap::kUndecided;
  if (a.address + a_reach <= b.address || b.address + b_reach <= a.address) return Overlap::kApart;
  const ByteCount gap = b.address - a.address;
  SharedByteSearch search(a, b);
  return search.find(0, 1 - b.element_bytes - gap, a.element_bytes - 1 - gap);
}

}  // namespace fusedattn::detail
