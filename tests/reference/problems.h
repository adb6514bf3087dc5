// Problems in one line, for every test suite: a dense problem, a packed varlen one, and a mask on
// top of either.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "reference/reference.h"

namespace fusedattn::testing {

// A dense problem in one line.
inline Problem dense(int batch, int heads_q, int heads_kv, int64_t seqlen_q, int64_t seqlen_k, int head_dim) {
  Problem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = head_dim;
  return p;
}

inline Problem packed(int heads_q, int heads_kv, int head_dim, std::vector<int64_t> lens_q, std::vector<int64_t> lens_k) {
  Problem p;
  p.batch = static_cast<int>(lens_q.size());
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.lens_q = std::move(lens_q);
  p.lens_k = std::move(lens_k);
  return p;
}

inline Problem with_mask(Problem p, bool causal, int64_t left, int64_t right) {
  p.causal = causal;
  p.window_left = left;
  p.window_right = right;
  return p;
}

}  // namespace fusedattn::testing
