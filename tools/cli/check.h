// The tool's own correctness check: a float64 recomputation of a random sample of rows (plus the
// first and last), compared with what the backend wrote. No dependency on the test library.
//
// Both passes are judged by the 2x rule: error against float64 <= 2 * the error of a plain
// same-dtype computation of the same rows (fp32 accumulation; S, P, and in the backward dP and dS,
// rounded to the dtype) + a small atol. Forward: out and lse rows. Backward: dq rows and dk/dv
// rows of one or two (batch, kv-head) groups, with the softmax statistics of every query row of
// the group recomputed in float64 and as the plain computation has them; its atol also covers the
// fp32 rounding where the plain computation is exact by its order of summation (check.cpp).
// Where the plain computation overflows its dtype (fp16 scores past 65504 at a large
// --softmax-scale) the bar is 8 dtype steps of the reference's largest magnitude instead.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "workload.h"

namespace fusedattn::cli {

struct TensorCheck {
  std::string name;    // "out", "lse", "dq", "dk", "dv"
  double max_err = 0;  // max |got - float64| over the checked rows; +inf where NaN/Inf disagree
  double bound = 0;    // the largest error accepted (finite: check.cpp's two_x_bar)
  int64_t rows = 0;
  // An infinite error (a NaN or a wrong infinity) never passes, whatever the bound.
  bool passed() const { return max_err <= bound && max_err < std::numeric_limits<double>::infinity(); }
};

struct CheckReport {
  std::vector<TensorCheck> tensors;  // empty when the check was switched off (--check-rows 0)
  bool passed() const;
  std::string str() const;  // "out:1.2e-07<=3.0e-06,lse:..." 
};

// Both read the host copies: fetch the outputs first.
CheckReport check_forward(const Workload& w);
CheckReport check_backward(const Workload& w);

}  // namespace fusedattn::cli
