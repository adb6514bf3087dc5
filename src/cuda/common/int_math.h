// Integer rounding for tile counts, grid sizes and padded extents, on the host and in kernels.
// For a >= 0 and b > 0; the result has the type a + b has, as the spelled-out expression would.
#pragma once

#include "fusedattn/params.h"  // FUSEDATTN_HD

namespace fusedattn::cuda {

// ceil(a / b).
template <typename A, typename B>
FUSEDATTN_HD constexpr auto ceil_div(A a, B b) -> decltype((a + b - 1) / b) {
  return (a + b - 1) / b;
}

// a rounded up to a multiple of b.
template <typename A, typename B>
FUSEDATTN_HD constexpr auto round_up(A a, B b) -> decltype(ceil_div(a, b) * b) {
  return ceil_div(a, b) * b;
}

}  // namespace fusedattn::cuda
