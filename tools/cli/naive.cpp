#include "naive.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "mask.h"
#include "parallel.h"

namespace fusedattn::cli {
namespace {

// Beyond this the remaining heads are extrapolated rather than run.
constexpr double kTimeBudgetSeconds = 30.0;
// Score matrices of all workers together stay below this many bytes.
constexpr double kScoreMemoryBudget = 8.0 * (1ull << 30);

// One head, the textbook way: S = scale * Q K^T with masked entries at -inf, P = softmax(S) row
// by row, O = P V. Returns a checksum so the work cannot be optimised away.
double naive_head(const RunConfig& c, const Workload& w, int64_t b, int64_t h, std::vector<double>& s) {
  const int64_t sq = c.seqlen_q, sk = c.seqlen_k;
  const int D = c.head_dim;
  const int64_t hk = h / (c.heads_q / c.heads_kv);
  std::vector<double> q(static_cast<size_t>(sq * D)), k(static_cast<size_t>(sk * D)), v(k.size()), o(q.size(), 0.0);
  for (int64_t i = 0; i < sq; ++i) w.q.read_row(b, i, h, &q[i * D]);
  for (int64_t j = 0; j < sk; ++j) {
    w.k.read_row(b, j, hk, &k[j * D]);
    w.v.read_row(b, j, hk, &v[j * D]);
  }
  const double scale = c.softmax_scale();
  s.assign(static_cast<size_t>(sq * sk), -std::numeric_limits<double>::infinity());
  for (int64_t i = 0; i < sq; ++i) {
    const KeySpan span = visible_keys(c, i);
    for (int64_t j = span.lo; j <= span.hi; ++j) {
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += q[i * D + d] * k[j * D + d];
      s[i * sk + j] = scale * acc;
    }
  }
  double checksum = 0;
  for (int64_t i = 0; i < sq; ++i) {
    double* row = &s[i * sk];
    const double m = *std::max_element(row, row + sk);
    if (std::isinf(m)) continue;  // fully masked: out stays 0
    double sum = 0;
    for (int64_t j = 0; j < sk; ++j) sum += (row[j] = std::exp(row[j] - m));
    for (int64_t j = 0; j < sk; ++j) row[j] /= sum;
    for (int64_t j = 0; j < sk; ++j)
      for (int d = 0; d < D; ++d) o[i * D + d] += row[j] * v[j * D + d];
    checksum += o[i * D] + m + std::log(sum);
  }
  return checksum;
}

}  // namespace

NaiveTiming time_naive_forward(const Workload& w, Progress& progress) {
  const RunConfig& c = w.config;
  NaiveTiming t;
  t.heads_total = static_cast<int64_t>(c.batch) * c.heads_q;
  const double score_bytes = static_cast<double>(c.seqlen_q) * static_cast<double>(c.seqlen_k) * sizeof(double);
  t.workers = static_cast<int>(std::clamp<double>(std::floor(kScoreMemoryBudget / score_bytes), 1.0, resolve_threads(c.threads)));

  std::atomic<int64_t> done{0};
  std::atomic<double> sink{0};  // keeps the naive results observable
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  // Each worker takes the next pair until none is left or the budget is spent.
  std::atomic<int64_t> next{0};
  parallel_for(t.workers, t.workers, [&](int64_t, int64_t) {
    std::vector<double> scores;
    double checksum = 0;
    for (int64_t n; (n = next++) < t.heads_total && elapsed_s() < kTimeBudgetSeconds;) {
      checksum += naive_head(c, w, n / c.heads_q, n % c.heads_q, scores);
      progress.update("naive float64 reference, heads", ++done, t.heads_total);
    }
    sink.fetch_add(checksum);
  });
  t.heads_timed = done.load();
  t.ms = elapsed_s() * 1e3 * static_cast<double>(t.heads_total) / static_cast<double>(std::max<int64_t>(t.heads_timed, 1));
  return t;
}

}  // namespace fusedattn::cli
