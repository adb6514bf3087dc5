// Forwards whose keys are split into parts (forward.cpp's split launches, decode.cpp): few tasks
// over long key ranges would leave threads idle while each task walks every key tile, so each
// task's keys are cut into parts run as tasks of their own and combined afterwards. Only the task
// count and the keys decide the split, never the thread count, and parts are combined in part
// order, so results do not depend on which thread ran which part.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/config.h"
#include "cpu/isa.h"
#include "cpu/mask.h"
#include "cpu/softmax.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

inline constexpr int64_t kSplitTargetTasks = 64;
inline constexpr int64_t kMinKeysPerPart = 1024;
inline constexpr int64_t kMaxKeyParts = 32;

// Parts per task for `tasks` tasks over up to `keys` keys each: 1 (no split) unless there are
// fewer than kSplitTargetTasks tasks and enough keys.
inline int split_parts(int64_t tasks, int64_t keys) {
  if (tasks <= 0 || tasks >= kSplitTargetTasks) return 1;
  const int64_t parts = std::min({kSplitTargetTasks / tasks, keys / kMinKeysPerPart, kMaxKeyParts});
  return parts < 2 ? 1 : static_cast<int>(parts);
}

// Part `part` of `parts` of the keys, in whole key tiles (empty, lo > hi, where it has none).
inline KeyRange part_of(KeyRange keys, int part, int parts) {
  if (parts == 1 || keys.lo > keys.hi) return keys;
  const int64_t tiles = (keys.hi - keys.lo) / kBlockK + 1;
  const int64_t first = tiles * part / parts, end = tiles * (part + 1) / parts;
  return {keys.lo + first * kBlockK, std::min(keys.hi, keys.lo + end * kBlockK - 1)};
}

// Part `part` of task `task` keeps `rows` rows of output (dim floats each, normalised over the
// part's keys) and their LSE, written by that part alone and read by the task's combine.
class PartRows {
 public:
  PartRows(int64_t tasks, int parts, int64_t rows, int dim)
      : parts_(parts), rows_(rows), dim_(dim),
        o_(static_cast<size_t>(tasks * parts * rows * dim)), lse_(static_cast<size_t>(tasks * parts * rows)) {}

  // The part's `rows` rows: o is [rows][dim], lse [rows].
  void save(int64_t task, int part, int rows, const float* o, const float* lse) {
    const int64_t slot = (task * parts_ + part) * rows_;
    std::copy(o, o + int64_t{rows} * dim_, o_.begin() + slot * dim_);
    std::copy(lse, lse + rows, lse_.begin() + slot);
  }

  // The task's rows combined, parts in order, into o ([rows][dim]) and lse ([rows]):
  //   m = max_p lse_p,  w_p = exp(lse_p - m),  O = sum_p w_p O_p / sum_p w_p,  lse = m + log(sum_p w_p);
  // a row that saw no key in any part gets 0 and -inf.
  void combine(int64_t task, int rows, float* o, float* lse) const {
    for (int r = 0; r < rows; ++r) {
      float m = kNegInf;
      for (int part = 0; part < parts_; ++part) m = std::max(m, lse_[slot(task, part) + r]);
      float* o_row = o + int64_t{r} * dim_;
      std::fill(o_row, o_row + dim_, 0.f);
      if (m == kNegInf) {
        lse[r] = kNegInf;
        continue;
      }
      float sum = 0.f;
      for (int part = 0; part < parts_; ++part) {
        const int64_t at = slot(task, part) + r;
        const float weight = std::exp(lse_[at] - m);
        sum += weight;
        const float* part_row = o_.data() + at * dim_;
        for (int d = 0; d < dim_; ++d) o_row[d] += weight * part_row[d];
      }
      for (int d = 0; d < dim_; ++d) o_row[d] /= sum;
      lse[r] = m + std::log(sum);
    }
  }

 private:
  int64_t slot(int64_t task, int part) const { return (task * parts_ + part) * rows_; }
  int parts_;
  int64_t rows_;
  int dim_;
  std::vector<float> o_, lse_;
};

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
