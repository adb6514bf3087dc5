// The online softmax of FlashAttention-2, one query row at a time, in log2 units: scores arrive
// already multiplied by scale * log2(e), so every exponential is exp2 of a value <= 0 and large
// logits cannot overflow. Normalisation by the running sum is deferred to finalize().
#pragma once

#include <cmath>
#include <limits>

#include "cpu/exp2.h"
#include "cpu/isa.h"
#include "cpu/mask.h"
#include "cpu/tile_math.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr double kLn2 = 0.69314718055994530942;

struct RowSoftmax {
  float max = kNegInf;  // running max of the scaled scores seen so far (log2 units)
  float sum = 0.f;      // running sum of exp2(score - max)

  // Folds in the scores s[range] of one key tile, replacing them with p = exp2(s - new max).
  // Returns the factor the row's output accumulator must be rescaled by (exp2(old - new max)).
  float update(float* s, ColRange range) {
    const int n = range.end - range.begin;
    if (n <= 0) return 1.f;
    float* x = s + range.begin;
    const float new_max = lane_max(x, n, max);
    // While every score so far is -inf, subtracting new_max would compute -inf - (-inf) = NaN;
    // offsetting by 0 instead gives p = 0 and keeps the row at "nothing seen yet".
    const float offset = new_max == kNegInf ? 0.f : new_max;
    // Every score is at most new_max (NaNs aside), so x - offset <= 0; all -inf with offset 0.
    exp2_scaled<Exp2Inputs::kNonPositive>(x, n, 1.f, offset);
    const float rescale = exp2_approx(max - offset);
    sum = sum * rescale + lane_sum(x, n);
    max = new_max;
    return rescale;
  }

  // A row that saw no key (fully masked, or zero keys) has sum 0: its output is 0 and its LSE
  // -inf, never the NaN of 0/0. Otherwise 1/sum normalises O, and the natural-log LSE is
  // ln(2^max * sum) = max * ln2 + ln(sum).
  bool empty() const { return sum == 0.f; }
  float inverse_sum() const { return empty() ? 0.f : 1.f / sum; }
  float lse() const {
    if (empty()) return kNegInf;
    return static_cast<float>(static_cast<double>(max) * kLn2 + std::log(static_cast<double>(sum)));
  }
};

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
