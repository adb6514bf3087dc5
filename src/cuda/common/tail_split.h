// Splitting the last wave of a launch of equal work items (full-mask launches: every KV block of
// the backward, every query tile of the forward, does the same number of steps). The sm80
// backward plans with this; the sm90 forward cuts its last items into balanced shares
// (tail_shares.h), of which these equal parts are one case, with the same costs and bounds.
//
// N items of L steps on P concurrent slots (CTAs that fit the GPU at once) take ceil(N / P)
// rounds; when N is just above a multiple of P most slots idle through the last round. The FA grid
// hits this everywhere: 2048 items (d128: 16k tokens x 16 heads / 128 rows) on 132 SMs are 15.5
// rounds, 3% of the run idle. Splitting each of the last T items (T = N mod P, or one wave more)
// into s parts of about L / s steps, whose partial results the last part to finish combines,
// fills that round. Each part pays the item's fixed cost again (loads before its first step,
// stores after its last) plus writing or combining its partial result, so splitting pays only
// when L is large against those costs: the plan compares the modelled makespans and keeps the
// split only where it saves at least kTailMinGain.
//
// Items [0, whole) run whole; items [whole, N) run as `parts` parts each. Part p of an item covers
// its steps [part_begin(L, parts, p), part_begin(L, parts, p + 1)).
#pragma once

#include <cstdint>

#include "cuda/common/int_math.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

struct TailCost {
  double item_steps;  // fixed cost of an item or a part (prologue, epilogue), in steps
  double part_steps;  // extra cost of a part: its partial result written and combined, in steps
};

struct TailSplit {
  int64_t whole = 0;  // items run whole (all of them when parts == 1)
  int parts = 1;      // parts of each of the other items
  int64_t split_items(int64_t items) const { return items - whole; }
  int64_t ctas(int64_t items) const { return whole + (items - whole) * parts; }
};

constexpr int kTailMaxParts = 8;       // more parts pay the fixed costs too often
constexpr int kTailMinPartSteps = 4;   // shorter parts are mostly fixed cost
constexpr double kTailMinGain = 0.01;  // a split must save 1% of the modelled makespan

// First step of part p of an item of `steps` steps cut into `parts` near-equal parts.
FUSEDATTN_HD int part_begin(int steps, int parts, int p) {
  return static_cast<int>(static_cast<int64_t>(steps) * p / parts);
}

// Modelled makespan, in steps, of `items` items of `steps` steps on `slots` slots with the last
// `split` items cut into `parts` parts each (the slots take the whole items first).
inline double tail_makespan(int64_t items, int steps, int64_t slots, int64_t split, int parts, TailCost cost) {
  const int64_t whole = items - split;
  const double whole_time = static_cast<double>(ceil_div(whole, slots)) * (steps + cost.item_steps);
  if (split == 0) return whole_time;
  const int64_t part_count = split * parts;
  const int longest_part = ceil_div(steps, parts);
  return whole_time + static_cast<double>(ceil_div(part_count, slots)) *
                          (longest_part + cost.item_steps + cost.part_steps);
}

// The split of the last wave that minimises the modelled makespan; parts == 1 (no split) when none
// saves kTailMinGain. Only whole waves run before the split items, so T = N mod P, or that plus
// one wave (T <= N).
inline TailSplit plan_tail_split(int64_t items, int steps, int64_t slots, TailCost cost) {
  TailSplit best{items, 1};
  if (items <= 0 || slots <= 0 || items % slots == 0) return best;
  const double unsplit = tail_makespan(items, steps, slots, 0, 1, cost);
  double best_time = unsplit * (1.0 - kTailMinGain);
  for (int64_t split = items % slots; split <= items && split <= items % slots + slots; split += slots) {
    for (int parts = 2; parts <= kTailMaxParts && steps / parts >= kTailMinPartSteps; ++parts) {
      const double t = tail_makespan(items, steps, slots, split, parts, cost);
      if (t < best_time) {
        best_time = t;
        best = {items - split, parts};
      }
    }
  }
  return best;
}

}  // namespace fusedattn::cuda
