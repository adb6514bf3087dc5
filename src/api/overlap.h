// Whether two strided views share a byte of memory: how validation keeps a call's written tensors
// apart from each other and from every tensor it reads (validate.cpp). A call that wrote into
// memory it still reads would give a silent wrong answer (on the CPU, the forward writing its
// output over a transposed view of q did), and two views of one buffer can be far apart, next to
// each other or interleaved (q, k and v of one packed qkv tensor), so the check is made per byte,
// not per buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

enum class Overlap {
  kApart,      // no byte lies in both
  kShared,     // some byte lies in both
  kUndecided,  // the search below gave up (strides that interleave finely); treated as shared
};

// Byte offsets and strides. Validation bounds neither a view's strides nor its sizes, so their
// products may pass int64; GCC and clang both have this type.
using ByteCount = __int128;

// A view's bytes: from its lowest address, equal elements of `element_bytes` each, placed by a
// list of (byte stride > 0, size > 1) dimensions. Dimensions of size 1 or stride 0 place nothing
// and are left out; one of negative stride places the same bytes as its mirror from its last
// element. An empty view holds no byte.
struct ByteView {
  ByteCount address = 0;  // of the first byte
  ByteCount element_bytes = 0;
  int dims = 0;
  ByteCount stride[kMaxRank] = {};
  int64_t size[kMaxRank] = {};
  bool empty = true;
};

// A validated tensor view (sizes and strides >= 0, rank <= kMaxRank) as bytes.
ByteView bytes_of(const TensorView& t);
// One contiguous range of bytes (a caller's workspace).
ByteView bytes_of(const void* data, std::size_t bytes);

// Exact for any two views, unless the search for a shared byte takes more than a few thousand
// steps (only views whose dimensions interleave each other's can), which gives kUndecided.
Overlap overlap(const ByteView& a, const ByteView& b);

}  // namespace fusedattn::detail
