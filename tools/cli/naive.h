// The naive peer (--peers-naive): a textbook float64 attention that materialises the whole
// [seqlen_q, seqlen_k] score matrix of a head, timed on the same shape in the same run, so the
// README can put the library's CPU figures next to it.
#pragma once

#include <cstdint>

#include "progress.h"
#include "workload.h"

namespace fusedattn::cli {

struct NaiveTiming {
  double ms = 0;             // wall time of the whole problem (measured, or scaled up from a subset)
  int64_t heads_timed = 0;   // (batch, head) pairs actually computed
  int64_t heads_total = 0;
  int workers = 0;           // threads used, one (batch, head) pair each at a time
  bool scaled() const { return heads_timed < heads_total; }
};

// Runs the forward of every (batch, head) pair, in parallel over pairs, until all are done or the
// time budget is spent; in the latter case the time is scaled by total/done pairs (every pair of
// a dense problem costs the same).
NaiveTiming time_naive_forward(const Workload& w, Progress& progress);

}  // namespace fusedattn::cli
