// Problems in one line, for every test suite: a dense problem, a packed varlen one, and a mask on
// top of either.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "fusedattn/params.h"
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

// The shape fields of the backend's parameters for a dense problem on CUDA device 0 (what
// the host plans and workspace layouts read; pointers and strides stay unset).
inline void set_shape(FwdParams& p, const Problem& pr) {
  p.batch = pr.batch;
  p.heads_q = pr.heads_q;
  p.heads_kv = pr.heads_kv;
  p.head_dim = pr.head_dim;
  p.seqlen_q = pr.seqlen_q;
  p.seqlen_k = pr.seqlen_k;
  p.device = {DeviceType::kCUDA, 0};
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
