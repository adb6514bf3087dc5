// Column-sparse masks (Options::column_mask) for the CPU and GPU suites: the int32 bounds tensor,
// and masks whose effect the float64 reference knows from another description (a window, packed
// causal documents, rows hidden from every key), so each suite checks the backend against the
// reference of that description over the same values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "reference/problems.h"
#include "reference/test_util.h"

namespace fusedattn::testing {

// [batch, heads, keys, 2 * intervals] int32 bounds: key j of (b, h) hides from query rows
// [lo, hi) of each of its intervals. Zeros (empty intervals) until hide() writes them. A HostTensor,
// so that the GPU suite uploads it like any other input.
struct Columns {
  int64_t batch, heads, keys, intervals;
  HostTensor bounds;
  Columns(int64_t b, int64_t h, int64_t k, int64_t n)
      : batch(b), heads(h), keys(k), intervals(n), bounds(DType::kInt32, {b, h, k, 2 * n}) {}
  void hide(int64_t b, int64_t h, int64_t j, int64_t interval, int64_t lo, int64_t hi) {
    int32_t* m = static_cast<int32_t*>(bounds.data()) + ((b * heads + h) * keys + j) * 2 * intervals + 2 * interval;
    m[0] = static_cast<int32_t>(lo);
    m[1] = static_cast<int32_t>(hi);
  }
  TensorView view() { return bounds.view(); }
};

// The window (left, right; -1 unbounded, causal: right 0) of an sq x sk problem, as the query rows
// each key hides from: key j is seen by rows [j - off - right, j - off + left] (off = sk - sq, the
// bottom-right alignment), so it hides from the rows before and after them.
inline void hide_outside_window(Columns& m, int64_t b, int64_t h, int64_t sq, int64_t sk, int64_t left,
                                int64_t right) {
  const int64_t off = sk - sq;
  for (int64_t j = 0; j < sk; ++j) {
    const int64_t first = right < 0 ? 0 : std::clamp<int64_t>(j - off - right, 0, sq);
    const int64_t after = left < 0 ? sq : std::clamp<int64_t>(j - off + left + 1, 0, sq);
    m.hide(b, h, j, 0, 0, first);
    m.hide(b, h, j, 1, after, sq);
  }
}

inline int64_t total_length(const std::vector<int64_t>& docs) {
  int64_t total = 0;
  for (int64_t n : docs) total += n;
  return total;
}

// Documents packed back to back into one sequence of (b, h) (document masks of packed SFT
// batches), in interval 0: key j of the document [s, e) hides from rows [e, total). With causal,
// the call is then the variable-length batch of those documents: the same rows in the same order.
inline void hide_later_documents(Columns& m, int64_t b, int64_t h, const std::vector<int64_t>& docs) {
  const int64_t total = total_length(docs);
  int64_t start = 0;
  for (int64_t n : docs) {
    for (int64_t j = start; j < start + n; ++j) m.hide(b, h, j, 0, start + n, total);
    start += n;
  }
}

// Every key of (b, h) hides from rows [lo, hi) (hi - lo >= 10), written as two overlapping pieces
// in reverse order, so that a backend which takes only one interval, or assumes them sorted or
// disjoint, leaves some of those rows visible.
inline void hide_rows_from_every_key(Columns& m, int64_t b, int64_t h, int64_t lo, int64_t hi) {
  for (int64_t j = 0; j < m.keys; ++j) {
    m.hide(b, h, j, 0, hi - 10, hi);
    m.hide(b, h, j, 1, lo, hi - 5);
  }
}

// Key j of (b, h) hides from rows [0, keys - 1 - j) of a square call: the spans fall with the key,
// so a later key block reaches further back. That is causal attention over K and V in reverse row
// order (key j at row keys - 1 - j): reversed_causal_references.
inline void hide_before_the_reversed_diagonal(Columns& m, int64_t b, int64_t h) {
  for (int64_t j = 0; j < m.keys; ++j) m.hide(b, h, j, 0, 0, m.keys - 1 - j);
}

// Zeroes query rows [lo, hi) of every sequence of a dense problem's canonical [B, Sq, H, width]
// values (width: head_dim for q, out, dout). A row that sees no key takes no part in the backward,
// so the reference of the unmasked problem with those dout rows zeroed gives its gradients.
inline void zero_rows(std::vector<double>& t, const Problem& p, int64_t width, int64_t lo, int64_t hi) {
  const int64_t row = int64_t{p.heads_q} * width;
  for (int64_t b = 0; b < p.batch; ++b)
    std::fill(t.begin() + (b * p.seqlen_q + lo) * row, t.begin() + (b * p.seqlen_q + hi) * row, 0.0);
}

// Query rows [lo, hi) of every sequence of a dense call that a mask hides from every key.
struct HiddenRows {
  int64_t lo = 0, hi = 0;
};

// A dense call with its own causal / window, and `truth`: a problem over the same values in the
// same canonical order that the reference runs (a window, or the variable-length batch of packed
// documents), and the rows the mask hides from every key.
struct MaskedCall {
  Problem call, truth;
  HiddenRows hidden;
};

// Causal documents packed into one sequence, written into m (one mask head, shared by every
// query head): the causal call, and the variable-length batch of the documents.
inline MaskedCall packed_documents(const std::vector<int64_t>& docs, int heads_q, int heads_kv, int d, Columns& m) {
  const int64_t total = total_length(docs);
  hide_later_documents(m, 0, 0, docs);
  return {with_mask(dense(1, heads_q, heads_kv, total, total, d), true, -1, -1),
          with_mask(packed(heads_q, heads_kv, d, docs, docs), true, -1, -1), {}};
}

// The float64 reference (ref) and the plain same-dtype implementation (plain) of `truth`'s forward
// on c's values, for c (a dense call with a column mask): the rows the mask hides from every key
// set to out 0 and lse -inf, and their dout zeroed for the gradients (where c has one: a
// forward-only case has none).
inline void masked_forward_references(const HostCase& c, const Problem& truth, HiddenRows hidden, Tensors& ref,
                                      Tensors& plain) {
  const Problem& call = c.problem;
  ref = c.values;
  plain = c.values;
  for (Tensors* t : {&ref, &plain})
    if (!t->dout.empty()) zero_rows(t->dout, call, call.head_dim, hidden.lo, hidden.hi);
  reference_forward(truth, ref);
  plain_forward(truth, c.dtype, plain);
  for (Tensors* t : {&ref, &plain}) {
    zero_rows(t->out, call, call.head_dim, hidden.lo, hidden.hi);
    for (int64_t bh = 0; bh < int64_t{call.batch} * call.heads_q; ++bh)
      std::fill(t->lse.begin() + bh * call.seqlen_q + hidden.lo, t->lse.begin() + bh * call.seqlen_q + hidden.hi,
                -INFINITY);
  }
}

// The forward's results in c (a dense call with a column mask) under the 2x rule against ref and
// plain (masked_forward_references); the rows the mask hides from every key must give out 0 and
// lse -inf exactly (the 2x rule's slack would let a near-zero pass).
inline void expect_masked_forward(const HostCase& c, const Tensors& ref, const Tensors& plain, HiddenRows hidden,
                                  double atol, double lse_atol, const std::string& name) {
  const Problem& call = c.problem;
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  EXPECT_TRUE(obeys_2x_rule(out, plain.out, ref.out, atol)) << "out of " << name;
  EXPECT_TRUE(obeys_2x_rule(lse, plain.lse, ref.lse, lse_atol)) << "lse of " << name;
  const int64_t row = int64_t{call.heads_q} * call.head_dim;
  for (int64_t b = 0; b < call.batch; ++b)
    for (int64_t i = hidden.lo; i < hidden.hi; ++i) {
      for (int64_t h = 0; h < call.heads_q; ++h)
        ASSERT_EQ(lse[(b * call.heads_q + h) * call.seqlen_q + i], -INFINITY)
            << "lse of hidden row " << i << " of " << name;
      for (int64_t e = (b * call.seqlen_q + i) * row; e < (b * call.seqlen_q + i + 1) * row; ++e)
        ASSERT_EQ(out[e], 0.0) << "out of hidden row " << i << " of " << name;
    }
}

// Reverses the order of each sequence's rows in t, canonical [batch, seqlen, width] values.
inline void reverse_rows(std::vector<double>& t, int64_t batch, int64_t seqlen, int64_t width) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0, j = seqlen - 1; i < j; ++i, --j)
      std::swap_ranges(t.begin() + (b * seqlen + i) * width, t.begin() + (b * seqlen + i + 1) * width,
                       t.begin() + (b * seqlen + j) * width);
}

// The float64 reference (ref) and, in fp16/bf16, the plain same-dtype implementation (plain) of c,
// a square dense call with the mask of hide_before_the_reversed_diagonal, forward and backward:
// causal attention over K and V in reverse row order, its dk and dv reversed back.
inline void reversed_causal_references(const HostCase& c, Tensors& ref, Tensors& plain) {
  const Problem& call = c.problem;
  const Problem truth = with_mask(call, true, -1, -1);
  const int64_t kv_row = int64_t{call.heads_kv} * call.head_dim;
  const auto reverse_keys = [&](std::vector<double>& k, std::vector<double>& v) {
    reverse_rows(k, call.batch, call.seqlen_k, kv_row);
    reverse_rows(v, call.batch, call.seqlen_k, kv_row);
  };
  ref = c.values;
  reverse_keys(ref.k, ref.v);
  reference_forward(truth, ref);
  reference_backward(truth, ref);
  reverse_keys(ref.dk, ref.dv);
  plain = c.values;
  if (c.dtype == DType::kFloat32) return;  // fp32 is judged by tolerance, without a plain bar
  reverse_keys(plain.k, plain.v);
  plain_forward(truth, c.dtype, plain);
  plain_backward(truth, c.dtype, plain);
  reverse_keys(plain.dk, plain.dv);
}

// The backend's results in c (a dense call with a column mask, run forward and backward) under
// the 2x rule against the reference of `truth`, a problem over the same values in the same
// canonical order. Hidden rows must give out 0, lse -inf and dq 0 (exactly; the 2x rule's slack
// would let a near-zero pass), and their dout is zeroed for the reference's gradients.
inline void expect_masked_results(const HostCase& c, const Problem& truth, HiddenRows hidden, double atol,
                                  double lse_atol) {
  const Problem& call = c.problem;
  const std::string name = call.str() + " " + dtype_name(c.dtype) + " with a column mask";
  Tensors ref, plain;
  masked_forward_references(c, truth, hidden, ref, plain);
  expect_masked_forward(c, ref, plain, hidden, atol, lse_atol, name);
  reference_backward(truth, ref);
  plain_backward(truth, c.dtype, plain);
  const std::vector<double> dq = c.dq.to_double();
  EXPECT_TRUE(obeys_2x_rule(dq, plain.dq, ref.dq, atol)) << "dq of " << name;
  EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol)) << "dk of " << name;
  EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol)) << "dv of " << name;
  const int64_t row = int64_t{call.heads_q} * call.head_dim;
  for (int64_t b = 0; b < call.batch; ++b)
    for (int64_t i = hidden.lo; i < hidden.hi; ++i)
      for (int64_t e = (b * call.seqlen_q + i) * row; e < (b * call.seqlen_q + i + 1) * row; ++e)
        ASSERT_EQ(dq[e], 0.0) << "dq of hidden row " << i << " of " << name;
}

}  // namespace fusedattn::testing
