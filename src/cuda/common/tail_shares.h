// Balanced shares of a launch's last items (full-mask forward launches, whose items are equal).
//
// N items of L steps on P slots run ceil(N / P) rounds; with N mod P items in the last round the
// other slots idle through it. tail_split.h cuts each of the last items into the same number of
// equal parts, which fills that round only where P is close to a multiple of the last items
// (2048 d128 tiles on 132 SMs leave 68: 136 halves take two rounds of half an item). Here the
// last T items (T = N mod P, or that plus one wave) are laid end to end, T x L steps, and cut
// into S shares of near-equal length: share j covers the steps [floor(j T L / S),
// floor((j + 1) T L / S)). With S = P every slot runs the same number of steps after the whole
// waves. A share is one work item; where it crosses an item's end it runs as segments, one per
// item it touches, each a part of that item (the last part of an item to finish combines them).
// S = T x parts gives tail_split.h's equal parts, one segment each, so the plan weighs both.
//
// Host and device: the launcher plans with it, the kernel's scheduler decodes shares into
// segments with it, and the tests ask it how their shapes split.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/common/int_math.h"
#include "cuda/common/tail_split.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

// A share's piece within one tail item: that item's steps [step_lo, step_hi), which are its part
// `part`. end: the flattened step after the segment.
struct TailSegment {
  int item;  // among the tail items, 0 .. tiles - 1
  int step_lo, step_hi;
  int part;
  int end;
};

// The kernel's producer thread decodes shares with 32-bit arithmetic (64-bit divisions spill its
// few registers): the plan keeps shares x tail steps below 2^31 (kMaxTailProduct).
constexpr int64_t kMaxTailProduct = (int64_t{1} << 31) - 1;

struct TailShares {
  int whole = 0;      // items run whole, before the shares
  int tiles = 0;      // the tail items after them, run as shares (0: no split)
  int steps = 0;      // steps of every item (L)
  int shares = 0;     // shares the tail is cut into (0: no split)
  int max_parts = 1;  // the most parts of one tail item (its workspace slots)

  // Every one of `items` items of `steps` steps run whole: no tail cut.
  FUSEDATTN_HD static constexpr TailShares unsplit(int items, int steps) { return {items, 0, steps, 0, 1}; }

  FUSEDATTN_HD bool split() const { return shares > 0; }
  // Work items the scheduler hands out: the whole items, then one per share.
  FUSEDATTN_HD int items() const { return whole + shares; }
  FUSEDATTN_HD int total_steps() const { return tiles * steps; }
  // The first flattened tail step of share j (j = shares: the tail's end).
  FUSEDATTN_HD int share_begin(int j) const { return j * total_steps() / shares; }
  // How many shares begin in (a, b], for 0 <= a <= b < total_steps(): share j begins at or after
  // y exactly when j >= ceil(y S / (T L)).
  FUSEDATTN_HD int share_starts_in(int a, int b) const {
    const int total = total_steps();
    return ceil_div((b + 1) * shares, total) - ceil_div((a + 1) * shares, total);
  }
  // The parts tail item `item` runs as: one more than the shares that begin inside it.
  FUSEDATTN_HD int parts_of(int item) const {
    const int lo = item * steps;
    return share_starts_in(lo, lo + steps - 1) + 1;
  }
  // The segment that starts at flattened step x of a share ending at share_end (x < share_end).
  FUSEDATTN_HD TailSegment segment_at(int x, int share_end) const {
    const int item = x / steps, lo = item * steps, hi = lo + steps;
    const int end = share_end < hi ? share_end : hi;
    return {item, x - lo, end - lo, share_starts_in(lo, x), end};
  }
};

// A cut's figures the plan weighs: the most parts of one item (the shares that touch it) and the
// longest share in steps with its fixed costs (one item cost and one part cost per segment). The
// plan runs on the host at every launch, so equal parts (S = T x parts, parts <= L: share j is
// part j mod parts of item j / parts, one segment) take them in closed form, other cuts in one
// walk over the shares.
struct TailShareCosts {
  int max_parts;
  double longest;
};
inline TailShareCosts tail_share_costs(const TailShares& s, TailCost cost) {
  const double per_segment = cost.item_steps + cost.part_steps;
  if (s.shares % s.tiles == 0) {
    const int parts = s.shares / s.tiles;
    return {parts, ceil_div(s.steps, parts) + per_segment};
  }
  TailShareCosts c{1, 0.0};
  int item = 0, parts = 0;  // the item the previous share ended in, and the shares touching it so far
  for (int j = 0, begin = 0; j < s.shares; ++j) {
    const int end = s.share_begin(j + 1);
    const int first = begin / s.steps, last = (end - 1) / s.steps;
    parts = first == item ? parts + 1 : 1;
    if (last != first) {  // the share leaves item `first` finished and starts the count of `last`
      c.max_parts = std::max(c.max_parts, parts);
      parts = 1;
    }
    item = last;
    c.max_parts = std::max(c.max_parts, parts);
    c.longest = std::max(c.longest, (end - begin) + (last - first + 1) * per_segment);
    begin = end;
  }
  return c;
}

// Whether the last `tail` of `items` items of `steps` steps can be cut into `shares` shares:
// at least two, none empty, and the decode's products in 32 bits.
inline bool can_cut_tail(int64_t items, int64_t tail, int steps, int64_t shares) {
  return shares >= 2 && tail <= items && shares <= tail * steps && items <= kMaxTailProduct &&
         (shares + 1) * tail * steps <= kMaxTailProduct;
}

// That cut (can_cut_tail must hold), and its longest share under `cost`: one walk over the
// shares gives both.
struct CostedCut {
  TailShares cut;
  double longest;
};
inline CostedCut cut_tail_costed(int64_t items, int64_t tail, int steps, int shares, TailCost cost) {
  TailShares s{static_cast<int>(items - tail), static_cast<int>(tail), steps, shares, 1};
  const TailShareCosts c = tail_share_costs(s, cost);
  s.max_parts = c.max_parts;
  return {s, c.longest};
}
inline TailShares cut_tail(int64_t items, int64_t tail, int steps, int shares) {
  return cut_tail_costed(items, tail, steps, shares, {0.0, 0.0}).cut;
}

// Modelled makespan, in steps, of `items` items on `slots` slots run as s (whole waves first,
// then the shares in rounds of `slots`, each as long as the longest share).
inline double tail_shares_makespan(int64_t items, int steps, int64_t slots, const TailShares& s, double longest,
                                   TailCost cost) {
  const int64_t whole = s.split() ? s.whole : items;
  const double whole_time = static_cast<double>(ceil_div(whole, slots)) * (steps + cost.item_steps);
  if (!s.split()) return whole_time;
  const int64_t rounds = ceil_div(s.shares, slots);
  return whole_time + static_cast<double>(rounds) * longest;
}
inline double tail_shares_makespan(int64_t items, int steps, int64_t slots, const TailShares& s, TailCost cost) {
  return tail_shares_makespan(items, steps, slots, s, s.split() ? tail_share_costs(s, cost).longest : 0.0, cost);
}

// The cut of the last items that minimises the modelled makespan: T = N mod P or that plus a
// wave; S = T x parts (equal parts, as tail_split.h) or S = P (balanced over the slots), each
// with shares of at least min_part_steps steps and at most max_parts parts per item. No split
// (shares == 0, every item whole) unless it saves kTailMinGain.
inline TailShares plan_tail_shares(int64_t items, int steps, int64_t slots, TailCost cost,
                                   int max_parts = kTailMaxParts, int min_part_steps = kTailMinPartSteps) {
  const TailShares unsplit = TailShares::unsplit(static_cast<int>(items), steps);
  if (items <= 0 || steps <= 0 || slots <= 0 || items % slots == 0) return unsplit;
  TailShares best = unsplit;
  double best_time = tail_shares_makespan(items, steps, slots, unsplit, cost) * (1.0 - kTailMinGain);
  const auto consider = [&](int64_t tail, int64_t shares) {
    if (!can_cut_tail(items, tail, steps, shares) || tail * steps < shares * int64_t{min_part_steps}) return;
    const CostedCut c = cut_tail_costed(items, tail, steps, static_cast<int>(shares), cost);
    if (c.cut.max_parts > max_parts) return;
    const double t = tail_shares_makespan(items, steps, slots, c.cut, c.longest, cost);
    if (t < best_time) {
      best_time = t;
      best = c.cut;
    }
  };
  for (int64_t tail = items % slots; tail <= items && tail <= items % slots + slots; tail += slots) {
    for (int parts = 2; parts <= max_parts; ++parts) consider(tail, tail * parts);
    consider(tail, slots);
  }
  return best;
}

}  // namespace fusedattn::cuda
