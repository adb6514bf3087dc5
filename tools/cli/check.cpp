#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numbers>
#include <random>
#include <set>
#include <tuple>
#include <functional>

#include "mask.h"
#include "numeric.h"
#include "parallel.h"

namespace fusedattn::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTwoXFactor = 2.0;

// Absolute slack of the 2x rule, for rows where the plain computation happens to be exact.
double forward_atol(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return 2e-4;
    case DType::kBFloat16: return 2e-3;
    default: return 1e-6;
  }
}

// The backward's 2x rule gets two kinds of slack, for rows where the plain computation happens to
// be exact:
// - one storage ulp of the gradient's scale (of 1 at least), as the test suite's rule has, so that
//   a result exact up to its final rounding passes; fp32 adds the forward's floor;
// - a few fp32 rounding steps (`fp32_steps`) of what the FlashAttention backward computes
//   differently from the plain one. Where a row sees one key, dP_ij and delta_i sum the same
//   products, so dq and dk are 0 exactly; the plain computation gets 0 too, since it sums both in
//   one order and its softmax gives P_ij = 1, while a kernel sums them in two orders (a matmul and
//   a row sum) and recomputes P from the saved lse. The steps of independent terms add in
//   quadrature. In fp16/bf16 the plain's own rounding of dP dwarfs them; fp32 runs on the CPU
//   backend only, where 4,600 random backward command lines (head dims 1-256, windows, GQA) erred
//   by at most 1.01 times these steps where the plain error was 0.
constexpr double kBackwardAtol = 1e-6;
constexpr double kFp32StepsFactor = 4.0;
double backward_atol(DType dtype, double ref_max, double fp32_steps) {
  return numeric::epsilon(dtype) * std::max(1.0, ref_max) + kFp32StepsFactor * fp32_steps + kBackwardAtol;
}

// |got - ref| for a value stored as `stored`, with equal infinities (a fully masked row's lse)
// counting as exact, and so an infinity where the reference rounds to it in that dtype (a
// gradient past fp16's range at a large --softmax-scale); any other non-finite value (a NaN left
// by the poison, an overflow) is an infinite error.
double abs_error(double got, double ref, DType stored) {
  if (got == ref) return 0;
  if (std::isinf(got) && numeric::round_to(stored, static_cast<float>(ref)) == got) return 0;
  if (!std::isfinite(got) || !std::isfinite(ref)) return kInf;
  return std::abs(got - ref);
}

// The 2x rule's bar before its slack: twice the plain computation's error. Where that computation
// overflowed its dtype (S rounded to fp16 past 65504 at a large --softmax-scale, giving NaN rows),
// its error is infinite and would accept anything; the bar is then kOverflowSteps dtype steps of
// the reference's largest magnitude instead (the test suite's large-logits rule).
constexpr double kOverflowSteps = 8.0;
double two_x_bar(double plain_err, DType dtype, double ref_max) {
  return std::isfinite(plain_err) ? kTwoXFactor * plain_err
                                  : kOverflowSteps * numeric::epsilon(dtype) * std::max(1.0, ref_max);
}

// The rows [0, n) of one head of an operand, decoded to double once and reused by every sample.
struct HeadRows {
  int64_t dim = 0;
  std::vector<double> data;
  const double* row(int64_t i) const { return data.data() + i * dim; }
};

HeadRows decode_head(const Operand& t, int64_t b, int64_t h, int64_t rows, int64_t dim) {
  HeadRows r{dim, std::vector<double>(static_cast<size_t>(rows * dim))};
  for (int64_t i = 0; i < rows; ++i) t.read_row(b, i, h, r.data.data() + i * dim);
  return r;
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

float plain_dot(const double* a, const double* b, int64_t n) {
  float s = 0.f;
  for (int64_t d = 0; d < n; ++d) s += static_cast<float>(a[d]) * static_cast<float>(b[d]);
  return s;
}

// a . b three ways in one pass: exactly (float64), the sum of its terms' sizes, and as the plain
// implementation sums it (plain_dot's fp32 order).
struct Dots {
  double exact = 0, size = 0;
  float plain = 0.f;
};
Dots dots(const double* a, const double* b, int64_t n) {
  Dots r;
  for (int64_t d = 0; d < n; ++d) {
    const double term = a[d] * b[d];
    r.exact += term;
    r.size += std::abs(term);
    r.plain += static_cast<float>(a[d]) * static_cast<float>(b[d]);
  }
  return r;
}

// Exact softmax row i: out (dim values) and lse; a fully masked row gives 0 and -inf.
void exact_row(const RunConfig& c, const double* q, const HeadRows& k, const HeadRows& v, int64_t i,
               std::vector<double>& scores, double* out, double& lse) {
  const KeySpan span = visible_keys(c, i);
  std::fill(out, out + c.head_dim, 0.0);
  if (span.size() == 0) {
    lse = -kInf;
    return;
  }
  const double scale = c.softmax_scale();
  scores.resize(static_cast<size_t>(span.size()));
  double m = -kInf;
  for (int64_t j = span.lo; j <= span.hi; ++j) m = std::max(m, scores[j - span.lo] = scale * dot(q, k.row(j), c.head_dim));
  double sum = 0;
  for (int64_t j = span.lo; j <= span.hi; ++j) {
    const double p = std::exp(scores[j - span.lo] - m);
    sum += p;
    const double* vj = v.row(j);
    for (int d = 0; d < c.head_dim; ++d) out[d] += p * vj[d];
  }
  for (int d = 0; d < c.head_dim; ++d) out[d] /= sum;
  lse = m + std::log(sum);
}

// The slack a row's out and lse get for the log2 units the kernels take their exponentials in
// (exp2 of S * scale * log2(e) minus the row's max, both rounded to fp32): each argument rounds to
// steps of its own size, ~1.44x the natural-log argument's steps of the plain computation, which
// the 2x rule alone then misses at logits in the hundreds (fp32 at --softmax-scale 4 erred 3.1e-5
// against a bar of 3.0e-5). The slack is one fp32 step of the row's largest |S| in log2 units as
// a relative error of every P_j: out moves by it times sum_j P_j |v_j|, lse by it times ln 2.
// (The worst case adds up to a few such steps, but P's errors are independent and mostly cancel:
// at the default scale this adds ~40% to the fp32 bar, at scale 4 it is ~2x the error seen.)
// Call after exact_row, whose scores it reads.
struct ArgumentSlack {
  double out = 0, lse = 0;
};
constexpr double kArgumentSteps = 1.0;
ArgumentSlack argument_slack(const RunConfig& c, const std::vector<double>& scores, const HeadRows& v, int64_t i,
                             double lse) {
  const KeySpan span = visible_keys(c, i);
  if (span.size() == 0) return {};
  double largest = 0;
  for (int64_t j = span.lo; j <= span.hi; ++j) largest = std::max(largest, std::abs(scores[j - span.lo]));
  const double relative = kArgumentSteps * numeric::epsilon(DType::kFloat32) * largest * std::numbers::log2e;
  std::vector<double> weighted(static_cast<size_t>(c.head_dim), 0.0);  // sum_j P_j |v_j|
  for (int64_t j = span.lo; j <= span.hi; ++j) {
    const double p = std::exp(scores[j - span.lo] - lse);
    const double* vj = v.row(j);
    for (int d = 0; d < c.head_dim; ++d) weighted[d] += p * std::abs(vj[d]);
  }
  const double spread = *std::max_element(weighted.begin(), weighted.end());
  return {relative * spread, relative * std::numbers::ln2};
}

// A plain implementation in the storage dtype: fp32 dot products, S rounded to the dtype, softmax
// in fp32, P rounded to the dtype, PV accumulated in fp32 and rounded to the dtype. Its error sets
// the bar of the 2x rule.
struct PlainStats {  // a row's fp32 softmax statistics
  float max = -std::numeric_limits<float>::infinity();
  float sum = 0.f;
  double lse() const { return max + std::log(sum); }
};

// S_ij from its fp32 dot product q_i . k_j: scaled and rounded to the dtype.
float plain_score(const RunConfig& c, float qk) {
  return numeric::round_to(c.dtype, qk * static_cast<float>(c.softmax_scale()));
}

float plain_prob(DType dtype, float score, const PlainStats& row) {
  return numeric::round_to(dtype, std::exp(score - row.max) / row.sum);
}

// Row i of the plain forward: out (dim values, rounded to the dtype) and the row's statistics.
PlainStats plain_row(const RunConfig& c, const double* q, const HeadRows& k, const HeadRows& v, int64_t i,
                     std::vector<float>& scores, double* out) {
  const KeySpan span = visible_keys(c, i);
  std::fill(out, out + c.head_dim, 0.0);
  PlainStats row;
  if (span.size() == 0) return row;
  scores.resize(static_cast<size_t>(span.size()));
  for (int64_t j = span.lo; j <= span.hi; ++j) {
    scores[j - span.lo] = plain_score(c, plain_dot(q, k.row(j), c.head_dim));
    row.max = std::max(row.max, scores[j - span.lo]);
  }
  std::vector<float> acc(static_cast<size_t>(c.head_dim), 0.f);
  for (float& s : scores) row.sum += std::exp(s - row.max);
  for (int64_t j = span.lo; j <= span.hi; ++j) {
    const float p = plain_prob(c.dtype, scores[j - span.lo], row);
    const double* vj = v.row(j);
    for (int d = 0; d < c.head_dim; ++d) acc[d] += p * static_cast<float>(vj[d]);
  }
  for (int d = 0; d < c.head_dim; ++d) out[d] = numeric::round_to(c.dtype, acc[d]);
  return row;
}

struct RowId {
  int64_t b, h, i;
  auto operator<=>(const RowId&) const = default;
};

// `count` distinct rows of a [batch, heads, rows] grid: always the first and the last (they
// exercise the zero offsets and the largest ones), the rest uniformly random.
std::vector<RowId> sample_rows(int64_t count, int64_t batch, int64_t heads, int64_t rows, uint64_t seed) {
  const int64_t total = batch * heads * rows;
  count = std::min(count, total);
  std::set<RowId> picked;
  if (count >= 1) picked.insert({0, 0, 0});
  if (count >= 2) picked.insert({batch - 1, heads - 1, rows - 1});
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<int64_t> pick(0, total - 1);
  while (static_cast<int64_t>(picked.size()) < count) {
    const int64_t x = pick(engine);
    picked.insert({x / (heads * rows), (x / rows) % heads, x % rows});
  }
  return {picked.begin(), picked.end()};
}

// Independent sample streams of the user's seed for each group and kind of row.
constexpr uint64_t kForwardSalt = 0x5A5A;
constexpr uint64_t kGroupSalt = 0xB0B0;
constexpr uint64_t kDqSalt = 0xD0D0;
constexpr uint64_t kKvSalt = 0xCAFE;
uint64_t sample_seed(uint64_t seed, uint64_t salt, int64_t b, int64_t h) {
  return std::hash<uint64_t>{}(seed ^ salt) ^ (static_cast<uint64_t>(b) << 32) ^ static_cast<uint64_t>(h);
}

TensorCheck make_check(const char* name, double err, double bound, int64_t rows) {
  return TensorCheck{name, err, bound, rows};
}

}  // namespace

bool CheckReport::passed() const {
  return std::all_of(tensors.begin(), tensors.end(), [](const TensorCheck& t) { return t.passed(); });
}

std::string CheckReport::str() const {
  if (tensors.empty()) return "off";
  std::string s;
  char buf[96];
  for (const TensorCheck& t : tensors) {
    std::snprintf(buf, sizeof buf, "%s%s:%.2e<=%.2e", s.empty() ? "" : ",", t.name.c_str(), t.max_err, t.bound);
    s += buf;
  }
  return s;
}

CheckReport check_forward(const Workload& w) {
  const RunConfig& c = w.config;
  CheckReport report;
  if (c.check_rows == 0) return report;
  const std::vector<RowId> rows = sample_rows(c.check_rows, c.batch, c.heads_q, c.seqlen_q, sample_seed(c.seed, kForwardSalt, 0, 0));
  const int group = c.heads_q / c.heads_kv;
  const int threads = resolve_threads(c.threads);

  // Per sampled row: errors of the backend and of the plain computation.
  struct RowErrors {
    double out = 0, out_plain = 0, lse = 0, lse_plain = 0;
    double out_ref = 0, lse_ref = 0;  // the reference's largest magnitude (two_x_bar)
    ArgumentSlack slack;
  };
  std::vector<RowErrors> errors(rows.size());
  // Rows are sorted by (b, h), so the samples of one KV head are contiguous: decode its K and V once.
  size_t first = 0;
  while (first < rows.size()) {
    const int64_t b = rows[first].b, hk = rows[first].h / group;
    size_t last = first;
    while (last < rows.size() && rows[last].b == b && rows[last].h / group == hk) ++last;
    const HeadRows k = decode_head(w.k, b, hk, c.seqlen_k, c.head_dim);
    const HeadRows v = decode_head(w.v, b, hk, c.seqlen_k, c.head_dim);
    parallel_for(static_cast<int64_t>(last - first), threads, [&](int64_t begin, int64_t end) {
      std::vector<double> q(c.head_dim), got(c.head_dim), ref(c.head_dim), plain(c.head_dim), scores;
      std::vector<float> plain_scores;
      for (int64_t n = begin; n < end; ++n) {
        const RowId& r = rows[first + n];
        w.q.read_row(r.b, r.i, r.h, q.data());
        w.out.read_row(r.b, r.i, r.h, got.data());
        double lse_ref = 0;
        exact_row(c, q.data(), k, v, r.i, scores, ref.data(), lse_ref);
        const double lse_plain = plain_row(c, q.data(), k, v, r.i, plain_scores, plain.data()).lse();
        RowErrors& e = errors[first + n];
        e.slack = argument_slack(c, scores, v, r.i, lse_ref);
        for (int d = 0; d < c.head_dim; ++d) {
          e.out = std::max(e.out, abs_error(got[d], ref[d], c.dtype));
          e.out_plain = std::max(e.out_plain, abs_error(plain[d], ref[d], c.dtype));
          e.out_ref = std::max(e.out_ref, std::abs(ref[d]));
        }
        e.lse = abs_error(w.lse.at(r.b, r.h, r.i), lse_ref, DType::kFloat32);
        e.lse_plain = abs_error(lse_plain, lse_ref, DType::kFloat32);
        if (std::isfinite(lse_ref)) e.lse_ref = std::abs(lse_ref);
      }
    });
    first = last;
  }
  RowErrors worst;
  for (const RowErrors& e : errors) {
    worst.out = std::max(worst.out, e.out);
    worst.out_plain = std::max(worst.out_plain, e.out_plain);
    worst.lse = std::max(worst.lse, e.lse);
    worst.lse_plain = std::max(worst.lse_plain, e.lse_plain);
    worst.out_ref = std::max(worst.out_ref, e.out_ref);
    worst.lse_ref = std::max(worst.lse_ref, e.lse_ref);
    worst.slack.out = std::max(worst.slack.out, e.slack.out);
    worst.slack.lse = std::max(worst.slack.lse, e.slack.lse);
  }
  const double atol = forward_atol(c.dtype);
  const auto n = static_cast<int64_t>(rows.size());
  report.tensors.push_back(make_check(
      "out", worst.out, two_x_bar(worst.out_plain, c.dtype, worst.out_ref) + worst.slack.out + atol, n));
  report.tensors.push_back(make_check(
      "lse", worst.lse, two_x_bar(worst.lse_plain, c.dtype, worst.lse_ref) + worst.slack.lse + atol, n));
  return report;
}

CheckReport check_backward(const Workload& w) {
  const RunConfig& c = w.config;
  CheckReport report;
  if (c.check_rows == 0) return report;
  const int group = c.heads_q / c.heads_kv;
  const int threads = resolve_threads(c.threads);
  const double scale = c.softmax_scale();
  const int D = c.head_dim;

  // A random (batch, kv head) group and the last one (largest offsets). dk/dv of a key row need
  // every query row of the group, so the check recomputes the softmax statistics and
  // delta_i = dout_i . out_i of all of them, exactly and as the plain implementation has them.
  std::mt19937_64 engine(sample_seed(c.seed, kGroupSalt, 0, 0));
  std::set<std::pair<int64_t, int64_t>> groups = {
      {std::uniform_int_distribution<int64_t>(0, c.batch - 1)(engine),
       std::uniform_int_distribution<int64_t>(0, c.heads_kv - 1)(engine)},
      {c.batch - 1, c.heads_kv - 1}};
  const int64_t rows_per_group = std::max<int64_t>(1, c.check_rows / static_cast<int64_t>(groups.size()));

  // Per tensor (dq, dk, dv): max errors of the backend and of the plain computation, max |reference|
  // and max fp32 steps (backward_atol).
  struct Errors {
    double err[3] = {}, plain[3] = {}, ref[3] = {}, steps[3] = {};
    void add(const Errors& o) {
      for (int t = 0; t < 3; ++t) {
        err[t] = std::max(err[t], o.err[t]);
        plain[t] = std::max(plain[t], o.plain[t]);
        ref[t] = std::max(ref[t], o.ref[t]);
        steps[t] = std::max(steps[t], o.steps[t]);
      }
    }
  };
  Errors worst;
  int64_t checked[3] = {};
  for (const auto& group_at : groups) {
    // Plain variables, not a structured binding: the lambdas below capture them, which clang
    // before 16 refuses for bindings.
    const int64_t b = group_at.first, hk = group_at.second;
    const HeadRows k = decode_head(w.k, b, hk, c.seqlen_k, D);
    const HeadRows v = decode_head(w.v, b, hk, c.seqlen_k, D);
    std::vector<HeadRows> q, dout;
    for (int g = 0; g < group; ++g) {
      q.push_back(decode_head(w.q, b, hk * group + g, c.seqlen_q, D));
      dout.push_back(decode_head(w.dout, b, hk * group + g, c.seqlen_q, D));
    }
    // [g * Sq + i]: the softmax statistics and delta of every query row of the group (delta_abs:
    // the sum of its terms' sizes).
    const auto group_rows = static_cast<size_t>(group * c.seqlen_q);
    std::vector<double> lse(group_rows), delta(group_rows), delta_abs(group_rows);
    std::vector<PlainStats> plain_stats(group_rows);
    std::vector<float> plain_delta(group_rows);
    parallel_for(static_cast<int64_t>(group_rows), threads, [&](int64_t begin, int64_t end) {
      std::vector<double> out(D), plain_out(D), scores;
      std::vector<float> plain_scores;
      for (int64_t n = begin; n < end; ++n) {
        const int64_t g = n / c.seqlen_q, i = n % c.seqlen_q;
        exact_row(c, q[g].row(i), k, v, i, scores, out.data(), lse[n]);
        const Dots d_o = dots(dout[g].row(i), out.data(), D);
        delta[n] = d_o.exact;
        delta_abs[n] = d_o.size;
        plain_stats[n] = plain_row(c, q[g].row(i), k, v, i, plain_scores, plain_out.data());
        plain_delta[n] = plain_dot(dout[g].row(i), plain_out.data(), D);
      }
    });
    // P_ij and dS_ij = P_ij (dP_ij - delta_i), dP_ij = dout_i . v_j: exactly, and as the plain
    // implementation has them (dP a matmul's output in the dtype, dS rounded to the dtype for the
    // dq/dk matmuls). p_step and ds_step: one fp32 step of P, recomputed as exp(S - lse), and of
    // dS (P's relative step, and a step of the terms whose difference dP_ij - delta_i is). Only
    // called for visible keys, so the row has a finite lse.
    struct ScoreGrad {
      double p, ds, p_step, ds_step;
      float plain_p, plain_ds;
    };
    auto score_grad = [&](int64_t g, int64_t i, int64_t j) {
      const int64_t n = g * c.seqlen_q + i;
      const double* qi = q[g].row(i);
      const double* oi = dout[g].row(i);
      const Dots qk = dots(qi, k.row(j), D), dp = dots(oi, v.row(j), D);
      ScoreGrad r;
      const double fp32_step = numeric::epsilon(DType::kFloat32);
      r.p = std::exp(scale * qk.exact - lse[n]);
      r.ds = r.p * (dp.exact - delta[n]);
      // exp's own step, and the steps of the argument's terms: S's products and the lse
      const double p_relative_steps = 1 + scale * qk.size + std::abs(lse[n]);
      r.p_step = r.p * fp32_step * p_relative_steps;
      r.ds_step = std::abs(r.ds) * fp32_step * p_relative_steps + r.p * fp32_step * (dp.size + delta_abs[n]);
      r.plain_p = plain_prob(c.dtype, plain_score(c, qk.plain), plain_stats[n]);
      const float plain_dp = numeric::round_to(c.dtype, dp.plain);
      r.plain_ds = numeric::round_to(c.dtype, r.plain_p * (plain_dp - plain_delta[n]));
      return r;
    };

    const std::vector<RowId> dq_rows = sample_rows(rows_per_group, 1, group, c.seqlen_q, sample_seed(c.seed, kDqSalt, b, hk));
    const std::vector<RowId> kv_rows = sample_rows(rows_per_group, 1, 1, c.seqlen_k, sample_seed(c.seed, kKvSalt, b, hk));
    std::vector<Errors> results(dq_rows.size() + kv_rows.size());
    parallel_for(static_cast<int64_t>(results.size()), threads, [&](int64_t begin, int64_t end) {
      // a: dq or dk, b: dv. The plain sums accumulate in fp32 and are scaled and rounded at the
      // end; the fp32 steps accumulate squared.
      std::vector<double> ref_a(D), ref_b(D), steps_a(D), steps_b(D), got(D);
      std::vector<float> plain_a(D), plain_b(D);
      auto compare = [&](Errors& e, int slot, const std::vector<double>& ref, const std::vector<float>& plain_acc,
                         float factor, const std::vector<double>& steps_squared) {
        for (int d = 0; d < D; ++d) {
          const double plain = numeric::round_to(c.dtype, factor * plain_acc[d]);
          e.err[slot] = std::max(e.err[slot], abs_error(got[d], ref[d], c.dtype));
          e.plain[slot] = std::max(e.plain[slot], abs_error(plain, ref[d], c.dtype));
          e.ref[slot] = std::max(e.ref[slot], std::abs(ref[d]));
          e.steps[slot] = std::max(e.steps[slot], std::sqrt(steps_squared[d]));
        }
      };
      auto square = [](double x) { return x * x; };
      const auto plain_scale = static_cast<float>(scale);
      for (int64_t n = begin; n < end; ++n) {
        std::fill(ref_a.begin(), ref_a.end(), 0.0);
        std::fill(ref_b.begin(), ref_b.end(), 0.0);
        std::fill(steps_a.begin(), steps_a.end(), 0.0);
        std::fill(steps_b.begin(), steps_b.end(), 0.0);
        std::fill(plain_a.begin(), plain_a.end(), 0.f);
        std::fill(plain_b.begin(), plain_b.end(), 0.f);
        if (n < static_cast<int64_t>(dq_rows.size())) {
          // dq_i = scale * sum_j dS_ij k_j
          const int64_t g = dq_rows[n].h, i = dq_rows[n].i;
          const KeySpan span = visible_keys(c, i);
          for (int64_t j = span.lo; j <= span.hi; ++j) {
            const ScoreGrad sg = score_grad(g, i, j);
            const double* kj = k.row(j);
            for (int d = 0; d < D; ++d) {
              ref_a[d] += scale * sg.ds * kj[d];
              steps_a[d] += square(scale * sg.ds_step * kj[d]);
              plain_a[d] += sg.plain_ds * static_cast<float>(kj[d]);
            }
          }
          w.dq.read_row(b, i, hk * group + g, got.data());
          compare(results[n], 0, ref_a, plain_a, plain_scale, steps_a);
          continue;
        }
        // dk_j = scale * sum_{g,i} dS_ij q_i;  dv_j = sum_{g,i} P_ij dout_i
        const int64_t j = kv_rows[n - dq_rows.size()].i;
        for (int g = 0; g < group; ++g)
          for (int64_t i = 0; i < c.seqlen_q; ++i) {
            const KeySpan span = visible_keys(c, i);
            if (j < span.lo || j > span.hi) continue;
            const ScoreGrad sg = score_grad(g, i, j);
            const double* qi = q[g].row(i);
            const double* oi = dout[g].row(i);
            for (int d = 0; d < D; ++d) {
              ref_a[d] += scale * sg.ds * qi[d];
              steps_a[d] += square(scale * sg.ds_step * qi[d]);
              steps_b[d] += square(sg.p_step * oi[d]);
              ref_b[d] += sg.p * oi[d];
              plain_a[d] += sg.plain_ds * static_cast<float>(qi[d]);
              plain_b[d] += sg.plain_p * static_cast<float>(oi[d]);
            }
          }
        w.dk.read_row(b, j, hk, got.data());
        compare(results[n], 1, ref_a, plain_a, plain_scale, steps_a);
        w.dv.read_row(b, j, hk, got.data());
        compare(results[n], 2, ref_b, plain_b, 1.f, steps_b);
      }
    });
    for (const Errors& e : results) worst.add(e);
    checked[0] += static_cast<int64_t>(dq_rows.size());
    checked[1] = checked[2] = checked[1] + static_cast<int64_t>(kv_rows.size());
  }
  const char* names[3] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t) {
    const double bound =
        two_x_bar(worst.plain[t], c.dtype, worst.ref[t]) + backward_atol(c.dtype, worst.ref[t], worst.steps[t]);
    report.tensors.push_back(make_check(names[t], worst.err[t], bound, checked[t]));
  }
  return report;
}

}  // namespace fusedattn::cli
