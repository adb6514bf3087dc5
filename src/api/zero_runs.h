// A written tensor's bytes as the runs a 2-D memset takes (cudaMemset2DAsync's shape): `height`
// runs of `width` bytes, `pitch` bytes apart, as one block, repeated over the dimensions left.
// The backends zero a tensor by it, e.g. a backward's key gradients when no query row attends to
// a key (attention.cpp). The views the frameworks make take one block: contiguous ones one run,
// padded rows or a transposed layout one block of runs.
#pragma once

#include <cstdint>

#include "api/layout.h"
#include "fusedattn/tensor.h"

namespace fusedattn::detail {

struct ZeroRuns {
  int64_t width = 0;   // bytes of one run (0: nothing to write)
  int64_t pitch = 0;   // bytes from one run of a block to the next
  int64_t height = 0;  // runs of a block
  int outer_dims = 0;  // the dimensions the block repeats over
  int64_t outer_count[kMaxRank] = {};
  int64_t outer_stride[kMaxRank] = {};  // bytes

  // f(offset in bytes of a block's first run) for every block.
  template <class F>
  void for_each_block(F&& f) const {
    if (width == 0) return;
    int64_t index[kMaxRank] = {};
    for (;;) {
      int64_t offset = 0;
      for (int d = 0; d < outer_dims; ++d) offset += index[d] * outer_stride[d];
      f(offset);
      int d = 0;
      while (d < outer_dims && ++index[d] == outer_count[d]) index[d++] = 0;
      if (d == outer_dims) return;
    }
  }
};

// `t`'s elements as ZeroRuns. Validation has turned down views whose elements share memory
// (check_written), so taken in order of stride (dims_by_stride) each dimension steps past the ones
// before it: the dimensions that continue a run's bytes widen it, the next one and those that
// continue its steps make the block, the rest repeat it.
inline ZeroRuns zero_runs(const TensorView& t) {
  ZeroRuns r;
  if (t.numel() == 0) return r;
  int dims[kMaxRank];
  const int n = dims_by_stride(t, dims);
  const auto element = static_cast<int64_t>(dtype_size(t.dtype));
  int i = 0;
  int64_t run = 1;  // elements
  for (; i < n && t.stride[dims[i]] == run; ++i) run *= t.shape[dims[i]];
  r.width = run * element;
  r.height = 1;
  r.pitch = r.width;
  if (i < n) {
    const int64_t step = t.stride[dims[i]];
    r.pitch = step * element;
    for (; i < n && t.stride[dims[i]] == step * r.height; ++i) r.height *= t.shape[dims[i]];
  }
  for (; i < n; ++i, ++r.outer_dims) {
    r.outer_count[r.outer_dims] = t.shape[dims[i]];
    r.outer_stride[r.outer_dims] = t.stride[dims[i]] * element;
  }
  return r;
}

}  // namespace fusedattn::detail
