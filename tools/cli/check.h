// The tool's own correctness check: a float64 recomputation of a random sample of rows (plus the
// first and last), compared with what the backend wrote. No dependency on the test library.
//
// Forward: out and lse rows are judged by the 2x rule: error against float64 <= 2 * the error of a
// plain same-dtype computation of the same rows (fp32 accumulation, S and P rounded to the
// dtype) + a small atol. Backward: dq rows and dk/dv rows of one or two (batch, kv-head) groups,
// with the exact softmax statistics of every query row of the group recomputed in float64;
// judged against a bound of a few dtype rounding steps relative to the largest reference value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.h"

namespace fusedattn::cli {

struct TensorCheck {
  std::string name;    // "out", "lse", "dq", "dk", "dv"
  double max_err = 0;  // max |got - float64| over the checked rows; +inf where NaN/Inf disagree
  double bound = 0;    // the largest error accepted
  int64_t rows = 0;
  bool passed() const { return max_err <= bound; }
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
