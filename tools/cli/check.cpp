#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
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

// The backward rounds P and dS to the storage dtype before the dq/dk/dv matmuls and sums over
// thousands of terms, so its error is a few rounding steps of the largest gradient; fp32 gets a
// floor for the fp32 accumulation order.
constexpr double kBackwardRoundingSteps = 4.0;
constexpr double kBackwardFp32RelFloor = 1e-5;
constexpr double kBackwardAtol = 1e-6;
double backward_rel_tol(DType dtype) { return std::max(kBackwardRoundingSteps * numeric::epsilon(dtype), kBackwardFp32RelFloor); }

// |got - ref|, with equal infinities (a fully masked row's lse) counting as exact and any other
// non-finite value (a NaN left by the poison, an overflow) as an infinite error.
double abs_error(double got, double ref) {
  if (got == ref) return 0;
  if (!std::isfinite(got) || !std::isfinite(ref)) return kInf;
  return std::abs(got - ref);
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

// The same row as a plain implementation in the storage dtype computes it: fp32 dot products,
// S rounded to the dtype, softmax in fp32, P rounded to the dtype, PV accumulated in fp32 and
// rounded to the dtype. Its error sets the bar of the 2x rule.
void plain_row(const RunConfig& c, const double* q, const HeadRows& k, const HeadRows& v, int64_t i,
               std::vector<float>& scores, double* out, double& lse) {
  const KeySpan span = visible_keys(c, i);
  std::fill(out, out + c.head_dim, 0.0);
  if (span.size() == 0) {
    lse = -kInf;
    return;
  }
  const auto scale = static_cast<float>(c.softmax_scale());
  scores.resize(static_cast<size_t>(span.size()));
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = span.lo; j <= span.hi; ++j) {
    const double* kj = k.row(j);
    float s = 0.f;
    for (int d = 0; d < c.head_dim; ++d) s += static_cast<float>(q[d]) * static_cast<float>(kj[d]);
    s = numeric::round_to(c.dtype, s * scale);
    scores[j - span.lo] = s;
    m = std::max(m, s);
  }
  float sum = 0.f;
  for (float& s : scores) sum += (s = std::exp(s - m));
  std::vector<float> acc(static_cast<size_t>(c.head_dim), 0.f);
  for (int64_t j = span.lo; j <= span.hi; ++j) {
    const float p = numeric::round_to(c.dtype, scores[j - span.lo] / sum);
    const double* vj = v.row(j);
    for (int d = 0; d < c.head_dim; ++d) acc[d] += p * static_cast<float>(vj[d]);
  }
  for (int d = 0; d < c.head_dim; ++d) out[d] = numeric::round_to(c.dtype, acc[d]);
  lse = m + std::log(sum);
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
        double lse_ref = 0, lse_plain = 0;
        exact_row(c, q.data(), k, v, r.i, scores, ref.data(), lse_ref);
        plain_row(c, q.data(), k, v, r.i, plain_scores, plain.data(), lse_plain);
        RowErrors& e = errors[first + n];
        for (int d = 0; d < c.head_dim; ++d) {
          e.out = std::max(e.out, abs_error(got[d], ref[d]));
          e.out_plain = std::max(e.out_plain, abs_error(plain[d], ref[d]));
        }
        e.lse = abs_error(w.lse.at(r.b, r.h, r.i), lse_ref);
        e.lse_plain = abs_error(lse_plain, lse_ref);
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
  }
  const double atol = forward_atol(c.dtype);
  const auto n = static_cast<int64_t>(rows.size());
  report.tensors.push_back(make_check("out", worst.out, kTwoXFactor * worst.out_plain + atol, n));
  report.tensors.push_back(make_check("lse", worst.lse, kTwoXFactor * worst.lse_plain + atol, n));
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
  // every query row of the group, so the check recomputes the exact lse and
  // delta_i = dout_i . out_i of all of them: one float64 forward of the group's heads.
  std::mt19937_64 engine(sample_seed(c.seed, kGroupSalt, 0, 0));
  std::set<std::pair<int64_t, int64_t>> groups = {
      {std::uniform_int_distribution<int64_t>(0, c.batch - 1)(engine),
       std::uniform_int_distribution<int64_t>(0, c.heads_kv - 1)(engine)},
      {c.batch - 1, c.heads_kv - 1}};
  const int64_t rows_per_group = std::max<int64_t>(1, c.check_rows / static_cast<int64_t>(groups.size()));

  double err[3] = {}, ref_max[3] = {};  // dq, dk, dv
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
    // [g * Sq + i]: the exact softmax statistics of every query row of the group.
    std::vector<double> lse(static_cast<size_t>(group * c.seqlen_q)), delta(lse.size());
    parallel_for(static_cast<int64_t>(lse.size()), threads, [&](int64_t begin, int64_t end) {
      std::vector<double> out(D), scores;
      for (int64_t n = begin; n < end; ++n) {
        const int64_t g = n / c.seqlen_q, i = n % c.seqlen_q;
        exact_row(c, q[g].row(i), k, v, i, scores, out.data(), lse[n]);
        delta[n] = dot(dout[g].row(i), out.data(), D);
      }
    });
    // P_ij from the exact lse; a fully masked row (lse = -inf) has P = 0 by definition.
    auto prob = [&](int64_t g, int64_t i, int64_t j) {
      const double l = lse[g * c.seqlen_q + i];
      return std::isinf(l) ? 0.0 : std::exp(scale * dot(q[g].row(i), k.row(j), D) - l);
    };

    const std::vector<RowId> dq_rows = sample_rows(rows_per_group, 1, group, c.seqlen_q, sample_seed(c.seed, kDqSalt, b, hk));
    const std::vector<RowId> kv_rows = sample_rows(rows_per_group, 1, 1, c.seqlen_k, sample_seed(c.seed, kKvSalt, b, hk));
    // Per sampled row: max error and max |reference| of dq, dk, dv.
    struct RowResult {
      double err[3] = {}, ref[3] = {};
    };
    std::vector<RowResult> results(dq_rows.size() + kv_rows.size());
    parallel_for(static_cast<int64_t>(results.size()), threads, [&](int64_t begin, int64_t end) {
      std::vector<double> ref_a(D), ref_b(D), got(D);
      auto compare = [&](RowResult& r, int slot, const std::vector<double>& ref) {
        for (int d = 0; d < D; ++d) {
          r.err[slot] = std::max(r.err[slot], abs_error(got[d], ref[d]));
          r.ref[slot] = std::max(r.ref[slot], std::abs(ref[d]));
        }
      };
      for (int64_t n = begin; n < end; ++n) {
        std::fill(ref_a.begin(), ref_a.end(), 0.0);
        std::fill(ref_b.begin(), ref_b.end(), 0.0);
        if (n < static_cast<int64_t>(dq_rows.size())) {
          // dq_i = scale * sum_j P_ij (dP_ij - delta_i) k_j, with dP_ij = dout_i . v_j
          const int64_t g = dq_rows[n].h, i = dq_rows[n].i;
          const KeySpan span = visible_keys(c, i);
          for (int64_t j = span.lo; j <= span.hi; ++j) {
            const double ds = prob(g, i, j) * (dot(dout[g].row(i), v.row(j), D) - delta[g * c.seqlen_q + i]);
            for (int d = 0; d < D; ++d) ref_a[d] += scale * ds * k.row(j)[d];
          }
          w.dq.read_row(b, i, hk * group + g, got.data());
          compare(results[n], 0, ref_a);
          continue;
        }
        // dv_j = sum_{g,i} P_ij dout_i;  dk_j = scale * sum_{g,i} P_ij (dP_ij - delta_i) q_i
        const int64_t j = kv_rows[n - dq_rows.size()].i;
        for (int g = 0; g < group; ++g)
          for (int64_t i = 0; i < c.seqlen_q; ++i) {
            const KeySpan span = visible_keys(c, i);
            if (j < span.lo || j > span.hi) continue;
            const double p = prob(g, i, j);
            const double ds = p * (dot(dout[g].row(i), v.row(j), D) - delta[g * c.seqlen_q + i]);
            for (int d = 0; d < D; ++d) {
              ref_a[d] += scale * ds * q[g].row(i)[d];
              ref_b[d] += p * dout[g].row(i)[d];
            }
          }
        w.dk.read_row(b, j, hk, got.data());
        compare(results[n], 1, ref_a);
        w.dv.read_row(b, j, hk, got.data());
        compare(results[n], 2, ref_b);
      }
    });
    for (const RowResult& r : results)
      for (int t = 0; t < 3; ++t) {
        err[t] = std::max(err[t], r.err[t]);
        ref_max[t] = std::max(ref_max[t], r.ref[t]);
      }
    checked[0] += static_cast<int64_t>(dq_rows.size());
    checked[1] = checked[2] = checked[1] + static_cast<int64_t>(kv_rows.size());
  }
  const char* names[3] = {"dq", "dk", "dv"};
  const double rel = backward_rel_tol(c.dtype);
  for (int t = 0; t < 3; ++t) report.tensors.push_back(make_check(names[t], err[t], rel * ref_max[t] + kBackwardAtol, checked[t]));
  return report;
}

}  // namespace fusedattn::cli
