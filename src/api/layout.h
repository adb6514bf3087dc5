// A view's dimensions in order of stride: how the layout of a tensor the library writes is read,
// to check that no two elements share memory (validate.cpp, check_written) and to zero it
// (zero_runs.h).
#pragma once

#include <algorithm>

#include "fusedattn/tensor.h"

namespace fusedattn::detail {

// The dimensions of t longer than one element, smallest stride first (ties in dimension order),
// into dims; returns how many. Dimensions of size 1 take no part in a layout.
inline int dims_by_stride(const TensorView& t, int (&dims)[kMaxRank]) {
  int n = 0;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1) dims[n++] = d;
  std::stable_sort(dims, dims + n, [&](int a, int b) { return t.stride[a] < t.stride[b]; });
  return n;
}

}  // namespace fusedattn::detail
