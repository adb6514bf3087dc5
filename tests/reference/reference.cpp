// The float64 reference and the plain same-dtype implementation. Deliberately naive: for every
// (sequence, query head) the scores of each query row are materialised over the keys it may see,
// then softmax, then the weighted sum. The mask rule is written out here from the API's contract
// (attention.h: bottom-right aligned windows, causal == window_right 0) rather than reusing
// params.h, so that a mistake there shows up as a test failure instead of being copied.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "reference/reference.h"

namespace fusedattn::testing {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Where sequence b lives in the canonical tensors.
struct Seq {
  int64_t q_start, k_start;  // first packed row
  int64_t len_q, len_k;
};

Seq seq_of(const Problem& p, int b) {
  if (!p.varlen()) return {b * p.seqlen_q, b * p.seqlen_k, p.seqlen_q, p.seqlen_k};
  int64_t q0 = 0, k0 = 0;
  for (int i = 0; i < b; ++i) {
    q0 += p.lens_q[i];
    k0 += p.lens_k[i];
  }
  int64_t len_k = p.lens_k[b];
  if (!p.seqused_k.empty()) len_k = std::clamp<int64_t>(p.seqused_k[b], 0, len_k);
  return {q0, k0, p.lens_q[b], len_k};
}

// Keys [lo, hi] visible to query row i. The window is centred on the diagonal key
// i + len_k - len_q, so the last query row always lines up with the last key.
struct Visible {
  int64_t lo, hi;
  bool empty() const { return lo > hi; }
};

Visible visible_keys(const Problem& p, int64_t i, int64_t len_q, int64_t len_k) {
  const int64_t right = p.causal ? 0 : p.window_right;
  const int64_t diagonal = i + len_k - len_q;
  Visible v{0, len_k - 1};
  if (p.window_left >= 0) v.lo = std::max(v.lo, diagonal - p.window_left);
  if (right >= 0) v.hi = std::min(v.hi, diagonal + right);
  return v;
}

int kv_head_of(const Problem& p, int h) { return h / (p.heads_q / p.heads_kv); }

int64_t q_offset(const Problem& p, int64_t row, int h) { return (row * p.heads_q + h) * int64_t{p.head_dim}; }
int64_t k_offset(const Problem& p, int64_t row, int hk) { return (row * p.heads_kv + hk) * int64_t{p.head_dim}; }

int64_t lse_size(const Problem& p) { return p.total_q() * p.heads_q; }
int64_t q_size(const Problem& p) { return p.total_q() * p.heads_q * int64_t{p.head_dim}; }
int64_t k_size(const Problem& p) { return p.total_k() * p.heads_kv * int64_t{p.head_dim}; }

// out[j] = sum over d of a[d] * row(j)[d] for j in [0, n), each summed in the order of d, as one
// loop per row would (so every value is that loop's, bit for bit), but kDotRows rows at a time:
// their sums are independent chains the CPU overlaps, where a single row's chain waits out each
// add's latency (these sums are much of what the naive reference costs the suites' hosts).
constexpr int64_t kDotRows = 4;

template <typename Acc, typename T, typename RowFn>
void dots_in_order(const T* a, int D, int64_t n, RowFn row, Acc* out) {
  int64_t j = 0;
  for (; j + kDotRows <= n; j += kDotRows) {
    const T* r[kDotRows];
    Acc acc[kDotRows] = {};
    for (int64_t u = 0; u < kDotRows; ++u) r[u] = row(j + u);
    for (int d = 0; d < D; ++d)
      for (int64_t u = 0; u < kDotRows; ++u) acc[u] += static_cast<Acc>(a[d]) * static_cast<Acc>(r[u][d]);
    for (int64_t u = 0; u < kDotRows; ++u) out[j + u] = acc[u];
  }
  for (; j < n; ++j) {
    const T* r = row(j);
    Acc acc = 0;
    for (int d = 0; d < D; ++d) acc += static_cast<Acc>(a[d]) * static_cast<Acc>(r[d]);
    out[j] = acc;
  }
}

// ---- float64 -----------------------------------------------------------------------------------

// Scores of row i against its visible keys, scaled: s[j - lo].
std::vector<double> scores(const Problem& p, const Tensors& t, const Seq& s, int h, int64_t i, const Visible& vis) {
  const int D = p.head_dim;
  const double scale = p.scale();
  const double* q = &t.q[q_offset(p, s.q_start + i, h)];
  const int hk = kv_head_of(p, h);
  std::vector<double> out(static_cast<size_t>(vis.hi - vis.lo + 1));
  dots_in_order(q, D, vis.hi - vis.lo + 1, [&](int64_t j) { return &t.k[k_offset(p, s.k_start + vis.lo + j, hk)]; },
                out.data());
  for (double& x : out) x *= scale;
  return out;
}

// A row's softmax over its scores: e[j] = exp(sc[j] - max) and their sum. The max is only a shift
// for exp's range; a NaN score is skipped here but still reaches the sum and the output, which is
// what confines NaN to the rows that see it.
struct RowSoftmax {
  std::vector<double> e;
  double max = kNegInf, sum = 0;
  double lse() const { return max + std::log(sum); }
};

RowSoftmax row_softmax(const std::vector<double>& sc) {
  RowSoftmax r{std::vector<double>(sc.size())};
  for (double x : sc) r.max = std::max(r.max, x);
  for (size_t j = 0; j < sc.size(); ++j) r.sum += r.e[j] = std::exp(sc[j] - r.max);
  return r;
}

RowResult forward_row(const Problem& p, const Tensors& t, const Seq& s, int h, int64_t i) {
  const int D = p.head_dim;
  RowResult r{std::vector<double>(D, 0.0), kNegInf};
  const Visible vis = visible_keys(p, i, s.len_q, s.len_k);
  if (vis.empty()) return r;  // fully masked: out 0, lse -inf
  const RowSoftmax sm = row_softmax(scores(p, t, s, h, i, vis));
  for (size_t j = 0; j < sm.e.size(); ++j) {
    const double* v = &t.v[k_offset(p, s.k_start + vis.lo + static_cast<int64_t>(j), kv_head_of(p, h))];
    const double weight = sm.e[j] / sm.sum;  // once per key: the compiler cannot hoist it past the stores
    for (int d = 0; d < D; ++d) r.out[d] += weight * v[d];
  }
  r.lse = sm.lse();
  return r;
}

// ---- plain, in the storage dtype -----------------------------------------------------------------

// A plain implementation's row: fp32 accumulation, every matmul result rounded to dtype. Its lse,
// an fp32 output (flash_attn's softmax_lse), is the fp32 softmax's of the unrounded scores: taken
// from the scores rounded to bf16 (steps of 1/64 at 3) it set the 2x rule's bar at ~0.01, where the
// kernels' lse errs by ~1e-6. The inputs must already be values of dtype (plain_forward/
// plain_backward round them first), which keeps rounding out of the inner loops of million-key rows.
struct PlainRow {
  std::vector<float> p;  // rounded probabilities over the visible keys
  std::vector<double> out;
  double lse;
  Visible vis;
};

// A plain implementation's inputs as it holds them, in fp32: the whole-problem passes convert each
// element once instead of at every row that reads it (the same floats, so the same results).
struct PlainInputs {
  std::vector<float> q, k, v, dout;
  explicit PlainInputs(const Tensors& t)
      : q(t.q.begin(), t.q.end()), k(t.k.begin(), t.k.end()), v(t.v.begin(), t.v.end()),
        dout(t.dout.begin(), t.dout.end()) {}
};

// Inputs: Tensors (doubles, for sampled rows) or PlainInputs (their floats), the same values.
template <typename Inputs>
PlainRow plain_row(const Problem& p, DType dtype, const Inputs& t, const Seq& s, int h, int64_t i) {
  const int D = p.head_dim;
  const float scale = p.scale();
  PlainRow r{{}, std::vector<double>(D, 0.0), kNegInf, visible_keys(p, i, s.len_q, s.len_k)};
  if (r.vis.empty()) return r;
  const auto* q = &t.q[q_offset(p, s.q_start + i, h)];
  const int hk = kv_head_of(p, h);
  const int64_t n = r.vis.hi - r.vis.lo + 1;
  std::vector<float> sc32(static_cast<size_t>(n)), sc(static_cast<size_t>(n));
  dots_in_order(q, D, n, [&](int64_t j) { return &t.k[k_offset(p, s.k_start + r.vis.lo + j, hk)]; }, sc32.data());
  float m32 = -std::numeric_limits<float>::infinity();  // of the unrounded scores, for the lse
  for (int64_t j = 0; j < n; ++j) {
    sc32[j] *= scale;
    m32 = std::max(m32, sc32[j]);
    sc[j] = static_cast<float>(round_to(dtype, sc32[j]));
  }
  float m = -std::numeric_limits<float>::infinity();
  for (float x : sc) m = std::max(m, x);
  float sum = 0;
  std::vector<float> e(sc.size());
  for (size_t j = 0; j < sc.size(); ++j) sum += e[j] = std::exp(sc[j] - m);
  r.p.resize(sc.size());
  for (size_t j = 0; j < sc.size(); ++j) r.p[j] = static_cast<float>(round_to(dtype, e[j] / sum));
  std::vector<float> acc(D, 0.f);
  for (size_t j = 0; j < sc.size(); ++j) {
    const auto* v = &t.v[k_offset(p, s.k_start + r.vis.lo + static_cast<int64_t>(j), hk)];
    const float pj = r.p[j];
    for (int d = 0; d < D; ++d) acc[d] += pj * static_cast<float>(v[d]);
  }
  for (int d = 0; d < D; ++d) r.out[d] = round_to(dtype, acc[d]);
  float sum32 = 0;
  for (float x : sc32) sum32 += std::exp(x - m32);
  r.lse = static_cast<float>(m32 + std::log(sum32));
  return r;
}

}  // namespace

// ---- Problem ---------------------------------------------------------------------------------

int64_t Problem::total_q() const {
  if (!varlen()) return batch * seqlen_q;
  int64_t n = 0;
  for (int64_t l : lens_q) n += l;
  return n;
}

int64_t Problem::total_k() const {
  if (!varlen()) return batch * seqlen_k;
  int64_t n = 0;
  for (int64_t l : lens_k) n += l;
  return n;
}

namespace {
std::vector<int32_t> offsets(int batch, const std::vector<int64_t>& lens, int64_t dense_len, bool varlen) {
  std::vector<int32_t> cu(static_cast<size_t>(batch) + 1, 0);
  for (int b = 0; b < batch; ++b) cu[b + 1] = static_cast<int32_t>(cu[b] + (varlen ? lens[b] : dense_len));
  return cu;
}
}  // namespace

std::vector<int32_t> Problem::cu_seqlens_q() const { return offsets(batch, lens_q, seqlen_q, varlen()); }
std::vector<int32_t> Problem::cu_seqlens_k() const { return offsets(batch, lens_k, seqlen_k, varlen()); }

int64_t Problem::max_seqlen_q() const {
  if (!varlen()) return seqlen_q;
  return lens_q.empty() ? 0 : *std::max_element(lens_q.begin(), lens_q.end());
}

int64_t Problem::max_seqlen_k() const {
  if (!varlen()) return seqlen_k;
  return lens_k.empty() ? 0 : *std::max_element(lens_k.begin(), lens_k.end());
}

// The same float the API computes, so reference and backend scale by the identical value.
float Problem::scale() const {
  if (softmax_scale != 0.f) return softmax_scale;
  return head_dim > 0 ? 1.0f / std::sqrt(static_cast<float>(head_dim)) : 1.0f;
}

std::string Problem::str() const {
  std::ostringstream s;
  s << "B" << batch << " H" << heads_q << "/" << heads_kv;
  if (varlen()) {
    s << " varlen q[";
    for (size_t b = 0; b < lens_q.size(); ++b) s << (b ? "," : "") << lens_q[b];
    s << "] k[";
    for (size_t b = 0; b < lens_k.size(); ++b) s << (b ? "," : "") << lens_k[b];
    s << "]";
    if (!seqused_k.empty()) {
      s << " used[";
      for (size_t b = 0; b < seqused_k.size(); ++b) s << (b ? "," : "") << seqused_k[b];
      s << "]";
    }
  } else {
    s << " Sq" << seqlen_q << " Sk" << seqlen_k;
  }
  s << " D" << head_dim;
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softmax_scale != 0.f) s << " scale " << softmax_scale;
  if (max_seqlen_bound > 0) s << " max_seqlen " << max_seqlen_bound;
  return s.str();
}

int64_t out_offset(const Problem& p, int b, int h, int64_t i) { return q_offset(p, seq_of(p, b).q_start + i, h); }

int64_t lse_offset(const Problem& p, int b, int h, int64_t i) {
  if (p.varlen()) return h * p.total_q() + seq_of(p, b).q_start + i;
  return (int64_t{b} * p.heads_q + h) * p.seqlen_q + i;
}

// ---- entry points ----------------------------------------------------------------------------

RowResult reference_forward_row(const Problem& p, const Tensors& t, int b, int h, int64_t i) {
  return forward_row(p, t, seq_of(p, b), h, i);
}

RowResult plain_forward_row(const Problem& p, DType dtype, const Tensors& t, int b, int h, int64_t i) {
  PlainRow r = plain_row(p, dtype, t, seq_of(p, b), h, i);
  return {std::move(r.out), r.lse};
}

namespace {
// Fills t.out and t.lse row by row: row(s, h, i) gives query row i of head h in sequence s.
template <typename RowFn>
void store_rows(const Problem& p, Tensors& t, RowFn&& row) {
  t.out.assign(q_size(p), 0.0);
  t.lse.assign(lse_size(p), kNegInf);
  for (int b = 0; b < p.batch; ++b) {
    const Seq s = seq_of(p, b);
    for (int h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < s.len_q; ++i) {
        const auto r = row(s, h, i);
        std::copy(r.out.begin(), r.out.end(), t.out.begin() + q_offset(p, s.q_start + i, h));
        t.lse[lse_offset(p, b, h, i)] = r.lse;
      }
  }
}
}  // namespace

void reference_forward(const Problem& p, Tensors& t) {
  store_rows(p, t, [&](const Seq& s, int h, int64_t i) { return forward_row(p, t, s, h, i); });
}

namespace {
// The inputs as a plain implementation in dtype would hold them.
void round_inputs(DType dtype, Tensors& t) {
  for (std::vector<double>* x : {&t.q, &t.k, &t.v, &t.dout})
    for (double& e : *x) e = round_to(dtype, e);
}
}  // namespace

void plain_forward(const Problem& p, DType dtype, Tensors& t) {
  round_inputs(dtype, t);
  const PlainInputs in(t);
  store_rows(p, t, [&](const Seq& s, int h, int64_t i) { return plain_row(p, dtype, in, s, h, i); });
}

namespace {
// dS = P o (dP - delta) with P = softmax(S) recomputed in double, delta_i = sum_j P_ij dP_ij (or,
// given stored_out, dO_i . O_i over it); dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO; dK/dV
// accumulate over a GQA group's heads.
void backward_rows(const Problem& p, Tensors& t, const std::vector<double>* stored_out) {
  const int D = p.head_dim;
  const double scale = p.scale();
  t.dq.assign(q_size(p), 0.0);
  t.dk.assign(k_size(p), 0.0);
  t.dv.assign(k_size(p), 0.0);
  for (int b = 0; b < p.batch; ++b) {
    const Seq s = seq_of(p, b);
    for (int h = 0; h < p.heads_q; ++h) {
      const int hk = kv_head_of(p, h);
      for (int64_t i = 0; i < s.len_q; ++i) {
        const Visible vis = visible_keys(p, i, s.len_q, s.len_k);
        if (vis.empty()) continue;  // P = 0: this row contributes no gradient
        const std::vector<double> sc = scores(p, t, s, h, i, vis);
        const double lse = row_softmax(sc).lse();  // the forward's, without its output
        const int64_t qo = q_offset(p, s.q_start + i, h);
        const double* q = &t.q[qo];
        const double* dout = &t.dout[qo];
        std::vector<double> prob(sc.size()), dp(sc.size());
        dots_in_order(dout, D, static_cast<int64_t>(sc.size()),
                      [&](int64_t j) { return &t.v[k_offset(p, s.k_start + vis.lo + j, hk)]; }, dp.data());
        double delta = 0;
        for (size_t j = 0; j < sc.size(); ++j) {
          prob[j] = std::exp(sc[j] - lse);
          if (!stored_out) delta += prob[j] * dp[j];
        }
        if (stored_out)
          for (int d = 0; d < D; ++d) delta += dout[d] * (*stored_out)[qo + d];
        for (size_t j = 0; j < sc.size(); ++j) {
          const int64_t ko = k_offset(p, s.k_start + vis.lo + static_cast<int64_t>(j), hk);
          const double ds = prob[j] * (dp[j] - delta), scaled_ds = scale * ds, pj = prob[j];
          for (int d = 0; d < D; ++d) {
            t.dq[qo + d] += scaled_ds * t.k[ko + d];
            t.dk[ko + d] += scaled_ds * q[d];
            t.dv[ko + d] += pj * dout[d];
          }
        }
      }
    }
  }
}
}  // namespace

void reference_backward(const Problem& p, Tensors& t) { backward_rows(p, t, nullptr); }

void reference_backward_over_stored_out(const Problem& p, Tensors& t, const std::vector<double>& stored_out) {
  backward_rows(p, t, &stored_out);
}

// The same in the storage dtype: each matmul (dP, dS, dQ, dK, dV) accumulates in fp32 and is
// rounded once to dtype; delta = rowsum(dO o O) in fp32 from the plain forward's rounded O.
void plain_backward(const Problem& p, DType dtype, Tensors& t) {
  round_inputs(dtype, t);
  const PlainInputs in(t);
  const int D = p.head_dim;
  const float scale = p.scale();
  std::vector<float> dq(q_size(p), 0.f), dk(k_size(p), 0.f), dv(k_size(p), 0.f);
  auto rd = [dtype](double x) { return static_cast<float>(round_to(dtype, x)); };
  for (int b = 0; b < p.batch; ++b) {
    const Seq s = seq_of(p, b);
    for (int h = 0; h < p.heads_q; ++h) {
      const int hk = kv_head_of(p, h);
      for (int64_t i = 0; i < s.len_q; ++i) {
        const PlainRow fwd = plain_row(p, dtype, in, s, h, i);
        if (fwd.vis.empty()) continue;
        const int64_t qo = q_offset(p, s.q_start + i, h);
        float delta = 0;
        for (int d = 0; d < D; ++d) delta += in.dout[qo + d] * static_cast<float>(fwd.out[d]);
        std::vector<float> dp(fwd.p.size());
        dots_in_order(&in.dout[qo], D, static_cast<int64_t>(dp.size()),
                      [&](int64_t j) { return &in.v[k_offset(p, s.k_start + fwd.vis.lo + j, hk)]; }, dp.data());
        for (size_t j = 0; j < fwd.p.size(); ++j) {
          const int64_t ko = k_offset(p, s.k_start + fwd.vis.lo + static_cast<int64_t>(j), hk);
          const float pj = fwd.p[j], ds = rd(pj * (rd(dp[j]) - delta));
          for (int d = 0; d < D; ++d) {
            dq[qo + d] += ds * in.k[ko + d];
            dk[ko + d] += ds * in.q[qo + d];
            dv[ko + d] += pj * in.dout[qo + d];
          }
        }
      }
    }
  }
  auto finish = [&](const std::vector<float>& acc, float factor, std::vector<double>& dst) {
    dst.resize(acc.size());
    for (size_t n = 0; n < acc.size(); ++n) dst[n] = round_to(dtype, factor * acc[n]);
  };
  finish(dq, scale, t.dq);
  finish(dk, scale, t.dk);
  finish(dv, 1.0f, t.dv);
}

}  // namespace fusedattn::testing
