// The dense loops of the CPU backend on contiguous float tiles. The three tile products are
// register-blocked on 8-wide vectors (simd.h) along contiguous rows, so no product is a
// horizontal reduction; the row reductions use a fixed set of lanes. Every sum is folded in a
// fixed order, so results are identical run to run and thread to thread.
//
// Notation: rows index query rows of a tile, cols index keys, dim the head dimension. A `ranges`
// array gives, per query row, the key columns [begin, end) it may see; entries outside are never
// read or used, so a NaN in a key a row cannot see never reaches that row.
#pragma once

#include <cstdint>
#include <limits>

#include "cpu/config.h"
#include "cpu/isa.h"
#include "cpu/mask.h"
#include "cpu/simd.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// Register blocking of the score product: kRowsPerPass x kColsPerPass outputs live in
// kRowsPerPass * kColsPerPass / kVecWidth vector registers, plus 2 for the shared K row. The AVX2
// build takes 6 rows (12 + 2 of its 16 registers: 1-4% faster than 4 rows on a Zen 5 EPYC); the
// AVX-512 build 8 (16 + 2 of its 32: even with 4 on that Zen 5, docs/perf.md fifty-second session;
// on a 2-core Xeon the fp32 forward 5-9% and the backward 8% faster than 4 rows, sixty-ninth).
// Every score is the same sum in the same order whatever the blocking.
inline constexpr int kRowsPerPass = kVecWidth == 8 ? 6 : 8;
inline constexpr int kColsPerPass = 2 * kVecWidth;
// The accumulating products keep kChunk floats of one output row (a d64 row: kChunkVecs vectors)
// in registers while they fold in every term, so each output element is loaded and stored once
// per tile.
inline constexpr int kChunk = 64;
inline constexpr int kChunkVecs = kChunk / kVecWidth;

static_assert(kBlockK % kColsPerPass == 0, "score tiles are computed kColsPerPass columns at a time");

inline int round_up(int n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

namespace detail {
template <int kRows>
FUSEDATTN_CPU_INLINE void score_pass(const float* a, int dim, const float* bt, int ldb, int j, float* s, int lds) {
  Vec acc[kRows][2] = {};
  for (int d = 0; d < dim; ++d) {
    const Vec b0 = load_vec(bt + int64_t{d} * ldb + j), b1 = load_vec(bt + int64_t{d} * ldb + j + kVecWidth);
    for (int i = 0; i < kRows; ++i) {
      const float x = a[int64_t{i} * dim + d];
      acc[i][0] += x * b0;
      acc[i][1] += x * b1;
    }
  }
  for (int i = 0; i < kRows; ++i) {
    store_vec(s + int64_t{i} * lds + j, acc[i][0]);
    store_vec(s + int64_t{i} * lds + j + kVecWidth, acc[i][1]);
  }
}

// c[0, n) += sum of w * src[0, n) over the terms `for_each_term` yields as (w, src), folded in
// the order yielded: the same association as the plain loop, just with c held in registers.
template <class Terms>
FUSEDATTN_CPU_INLINE void fold_terms(float* c, int n, const Terms& for_each_term) {
  int d = 0;
  for (; d + kChunk <= n; d += kChunk) {
    Vec acc[kChunkVecs];
    for (int v = 0; v < kChunkVecs; ++v) acc[v] = load_vec(c + d + v * kVecWidth);
    for_each_term([&](float w, const float* src) {
      for (int v = 0; v < kChunkVecs; ++v) acc[v] += w * load_vec(src + d + v * kVecWidth);
    });
    for (int v = 0; v < kChunkVecs; ++v) store_vec(c + d + v * kVecWidth, acc[v]);
  }
  for (; d + kVecWidth <= n; d += kVecWidth) {
    Vec acc = load_vec(c + d);
    for_each_term([&](float w, const float* src) { acc += w * load_vec(src + d); });
    store_vec(c + d, acc);
  }
  for (; d < n; ++d) {
    float acc = c[d];
    for_each_term([&](float w, const float* src) { acc += w * src[d]; });
    c[d] = acc;
  }
}

// The same fold for two output rows whose terms share their source rows: c0 += sum w0 * src and
// c1 += sum w1 * src over the terms (w0, w1, src), each source vector loaded once for both, and two
// rows' chains of dependent FMAs interleaved. Each element's sum is the same as fold_terms' (same
// terms, same order, same ops), so results do not change. The backward gained 5-7% by it, the
// forward's P V read even (docs/perf.md, fifty-fourth session).
inline constexpr int kPairChunkVecs = 4;  // 2 x 4 accumulators: half the AVX2 build's registers
inline constexpr int kPairChunk = kPairChunkVecs * kVecWidth;
template <class Terms>
FUSEDATTN_CPU_INLINE void fold_terms_pair(float* c0, float* c1, int n, const Terms& for_each_term) {
  int d = 0;
  for (; d + kPairChunk <= n; d += kPairChunk) {
    Vec acc0[kPairChunkVecs], acc1[kPairChunkVecs];
    for (int v = 0; v < kPairChunkVecs; ++v) {
      acc0[v] = load_vec(c0 + d + v * kVecWidth);
      acc1[v] = load_vec(c1 + d + v * kVecWidth);
    }
    for_each_term([&](float w0, float w1, const float* src) {
      for (int v = 0; v < kPairChunkVecs; ++v) {
        const Vec x = load_vec(src + d + v * kVecWidth);
        acc0[v] += w0 * x;
        acc1[v] += w1 * x;
      }
    });
    for (int v = 0; v < kPairChunkVecs; ++v) {
      store_vec(c0 + d + v * kVecWidth, acc0[v]);
      store_vec(c1 + d + v * kVecWidth, acc1[v]);
    }
  }
  for (; d + kVecWidth <= n; d += kVecWidth) {
    Vec acc0 = load_vec(c0 + d), acc1 = load_vec(c1 + d);
    for_each_term([&](float w0, float w1, const float* src) {
      const Vec x = load_vec(src + d);
      acc0 += w0 * x;
      acc1 += w1 * x;
    });
    store_vec(c0 + d, acc0);
    store_vec(c1 + d, acc1);
  }
  for (; d < n; ++d) {
    float acc0 = c0[d], acc1 = c1[d];
    for_each_term([&](float w0, float w1, const float* src) {
      acc0 += w0 * src[d];
      acc1 += w1 * src[d];
    });
    c0[d] = acc0;
    c1[d] = acc1;
  }
}
}  // namespace detail

// s[r * lds + j] = sum_d a[r * dim + d] * bt[d * ldb + j] for r < rows, j < cols.
// (S = Q K^T with K pre-transposed, or dP = dO V^T with V pre-transposed.) Columns are computed
// in passes of kColsPerPass, so ldb and lds must be >= round_up(cols, kColsPerPass); the extra
// columns read whatever bt holds there and their scores are never used.
FUSEDATTN_CPU_INLINE void matmul_transposed_b(const float* a, int rows, int dim, const float* bt, int ldb, int cols,
                                               float* s, int lds) {
  const int cols_padded = round_up(cols, kColsPerPass);
  int r = 0;
  for (; r + kRowsPerPass <= rows; r += kRowsPerPass)
    for (int j = 0; j < cols_padded; j += kColsPerPass)
      detail::score_pass<kRowsPerPass>(a + int64_t{r} * dim, dim, bt, ldb, j, s + int64_t{r} * lds, lds);
  constexpr int kTailRows = 4;
  if constexpr (kRowsPerPass > kTailRows) {
    for (; r + kTailRows <= rows; r += kTailRows)
      for (int j = 0; j < cols_padded; j += kColsPerPass)
        detail::score_pass<kTailRows>(a + int64_t{r} * dim, dim, bt, ldb, j, s + int64_t{r} * lds, lds);
  }
  for (; r < rows; ++r)
    for (int j = 0; j < cols_padded; j += kColsPerPass)
      detail::score_pass<1>(a + int64_t{r} * dim, dim, bt, ldb, j, s + int64_t{r} * lds, lds);
}

namespace detail {
// c[i * dim + col, + kColsPerPass) += sum_{t in [t0, t1)} weight(i, t) * source(t)[col, ...) for
// i < kRows: score_pass's register blocking for the accumulating products, each source vector
// loaded once for kRows rows (the pair fold loads it once for two, and GCC folded that load into
// both rows' FMAs, so it waited on loads). Each element's sum is fold_terms' (the same terms in
// the same order from the same start), so results do not change.
template <int kRows, class Weight, class Source>
FUSEDATTN_CPU_INLINE void blocked_fold(float* c, int dim, int col, int t0, int t1, const Weight& weight,
                                       const Source& source) {
  Vec acc[kRows][2];
  for (int i = 0; i < kRows; ++i) {
    acc[i][0] = load_vec(c + int64_t{i} * dim + col);
    acc[i][1] = load_vec(c + int64_t{i} * dim + col + kVecWidth);
  }
  for (int t = t0; t < t1; ++t) {
    const float* src = source(t);
    const Vec x0 = load_vec(src + col), x1 = load_vec(src + col + kVecWidth);
    for (int i = 0; i < kRows; ++i) {
      const float w = weight(i, t);
      acc[i][0] += w * x0;
      acc[i][1] += w * x1;
    }
  }
  for (int i = 0; i < kRows; ++i) {
    store_vec(c + int64_t{i} * dim + col, acc[i][0]);
    store_vec(c + int64_t{i} * dim + col + kVecWidth, acc[i][1]);
  }
}
}  // namespace detail

// c[r * dim + :] += sum_{j in ranges[r]} p[r * ldp + j] * b[j * dim + :], keys folded in order.
// (O += P V, dQ += dS K.) kRowsPerPass rows that see the same keys (every row of a tile no mask
// cuts) take detail::blocked_fold over the head dim's whole kColsPerPass columns, the rest the
// folds.
FUSEDATTN_CPU_INLINE void accumulate_pb(const float* p, int ldp, const ColRange* ranges, int rows, const float* b,
                                         int dim, float* c) {
  const int dim_blocked = dim / kColsPerPass * kColsPerPass;
  for (int r = 0; r < rows;) {
    const float* p0 = p + int64_t{r} * ldp;
    const ColRange range = ranges[r];
    bool block = dim_blocked > 0 && r + kRowsPerPass <= rows;
    for (int i = 1; block && i < kRowsPerPass; ++i)
      block = ranges[r + i].begin == range.begin && ranges[r + i].end == range.end;
    if (block) {
      float* c0 = c + int64_t{r} * dim;
      for (int col = 0; col < dim_blocked; col += kColsPerPass)
        detail::blocked_fold<kRowsPerPass>(
            c0, dim, col, range.begin, range.end, [&](int i, int j) { return p0[int64_t{i} * ldp + j]; },
            [&](int j) { return b + int64_t{j} * dim; });
      for (int i = 0; i < kRowsPerPass; ++i)  // columns past the blocked ones
        detail::fold_terms(c0 + int64_t{i} * dim + dim_blocked, dim - dim_blocked, [&](auto&& term) {
          for (int j = range.begin; j < range.end; ++j) term(p0[int64_t{i} * ldp + j], b + int64_t{j} * dim + dim_blocked);
        });
      r += kRowsPerPass;
    } else if (r + 1 < rows && ranges[r + 1].begin == range.begin && ranges[r + 1].end == range.end) {
      // Two rows that see the same columns (every row of a tile no mask cuts) at once.
      const float* p1 = p0 + ldp;
      detail::fold_terms_pair(c + int64_t{r} * dim, c + int64_t{r + 1} * dim, dim, [&](auto&& term) {
        for (int j = range.begin; j < range.end; ++j) term(p0[j], p1[j], b + int64_t{j} * dim);
      });
      r += 2;
    } else {
      detail::fold_terms(c + int64_t{r} * dim, dim, [&](auto&& term) {
        for (int j = range.begin; j < range.end; ++j) term(p0[j], b + int64_t{j} * dim);
      });
      r += 1;
    }
  }
}

// c[j * dim + :] += sum_{r : j in ranges[r]} p[r * ldp + j] * a[r * dim + :] for j < cols, rows
// folded in order. (dV += P^T dO, dK += dS^T Q.)
FUSEDATTN_CPU_INLINE void accumulate_ptb(const float* p, int ldp, const ColRange* ranges, int rows, const float* a,
                                          int dim, int cols, float* c) {
  // Where every row sees every column (tiles no mask cuts), the same terms without the test, and
  // kRowsPerPass output rows at a time through detail::blocked_fold over the blocked columns.
  bool whole = true;
  for (int r = 0; r < rows; ++r) whole = whole && ranges[r].begin == 0 && ranges[r].end >= cols;
  const int dim_blocked = dim / kColsPerPass * kColsPerPass;
  int j = 0;
  if (whole && dim_blocked > 0)
    for (; j + kRowsPerPass <= cols; j += kRowsPerPass) {
      for (int col = 0; col < dim_blocked; col += kColsPerPass)
        detail::blocked_fold<kRowsPerPass>(
            c + int64_t{j} * dim, dim, col, 0, rows, [&](int i, int r) { return p[int64_t{r} * ldp + j + i]; },
            [&](int r) { return a + int64_t{r} * dim; });
      for (int i = 0; i < kRowsPerPass; ++i)  // columns past the blocked ones
        detail::fold_terms(c + int64_t{j + i} * dim + dim_blocked, dim - dim_blocked, [&](auto&& term) {
          for (int r = 0; r < rows; ++r) term(p[int64_t{r} * ldp + j + i], a + int64_t{r} * dim + dim_blocked);
        });
    }
  for (; j < cols; ++j) {
    if (whole && j + 1 < cols) {  // two output rows at once, sharing a's rows
      detail::fold_terms_pair(c + int64_t{j} * dim, c + int64_t{j + 1} * dim, dim, [&](auto&& term) {
        for (int r = 0; r < rows; ++r) term(p[int64_t{r} * ldp + j], p[int64_t{r} * ldp + j + 1], a + int64_t{r} * dim);
      });
      ++j;
    } else if (whole) {
      detail::fold_terms(c + int64_t{j} * dim, dim, [&](auto&& term) {
        for (int r = 0; r < rows; ++r) term(p[int64_t{r} * ldp + j], a + int64_t{r} * dim);
      });
    } else {
      detail::fold_terms(c + int64_t{j} * dim, dim, [&](auto&& term) {
        for (int r = 0; r < rows; ++r)
          if (j >= ranges[r].begin && j < ranges[r].end) term(p[int64_t{r} * ldp + j], a + int64_t{r} * dim);
      });
    }
  }
}

// The lanes of v folded by butterfly steps (half the width apart, then a quarter, ...), each lane
// ending with the fold of all: a fixed order whatever the data, on vector shuffles rather than a
// chain of scalar adds or compares (whose latency the row loops waited on).
template <class Fold>
FUSEDATTN_CPU_INLINE float fold_lanes(Vec v, const Fold& fold) {
  static_assert(kVecWidth == 8 || kVecWidth == 16, "the butterfly steps below cover 8 or 16 lanes");
  if constexpr (kVecWidth >= 16) v = fold(v, xor_lanes<8>(v));
  v = fold(v, xor_lanes<4>(v));
  v = fold(v, xor_lanes<2>(v));
  v = fold(v, xor_lanes<1>(v));
  return v[0];
}

// Fixed-lane sum of x[0, n): kVecWidth partial sums (lane l takes x[l], x[l + width], ...),
// folded by fold_lanes, then the tail in order: the same association for the same n on a given
// build, whatever the thread.
FUSEDATTN_CPU_INLINE float lane_sum(const float* x, int n) {
  Vec acc = broadcast(0.f);
  int j = 0;
  for (; j + kVecWidth <= n; j += kVecWidth) acc += load_vec(x + j);
  float total = fold_lanes(acc, [](Vec a, Vec b) { return a + b; });
  for (; j < n; ++j) total += x[j];
  return total;
}

// sum_d x[d] * y[d], with the lanes of lane_sum.
FUSEDATTN_CPU_INLINE float lane_dot(const float* x, const float* y, int n) {
  Vec acc = broadcast(0.f);
  int j = 0;
  for (; j + kVecWidth <= n; j += kVecWidth) acc += load_vec(x + j) * load_vec(y + j);
  float total = fold_lanes(acc, [](Vec a, Vec b) { return a + b; });
  for (; j < n; ++j) total += x[j] * y[j];
  return total;
}

// max(init, x[0, n)), skipping NaNs (`v > acc` is false for them). A NaN score still poisons its
// row, through exp2(NaN - max) in the softmax; skipping it here only keeps the max finite. On
// vectors: GCC left the scalar lanes' form scalar (3-4% of the fp32 forward's samples on an AVX2
// Zen 3, perf, sixty-fifth session). A maximum does not depend on the order it is taken in (but
// for the sign of a zero, which no caller can see: the softmax subtracts it), so the lanes'
// width and fold_lanes' order are free: the result is the one a scalar loop gives.
FUSEDATTN_CPU_INLINE float lane_max(const float* x, int n, float init) {
  // The lanes start from -inf and meet init after the fold: GCC builds a broadcast of a run-time
  // init lane by lane here, a constant's is one load.
  Vec acc = broadcast(-std::numeric_limits<float>::infinity());
  int j = 0;
  for (; j + kVecWidth <= n; j += kVecWidth) {
    const Vec v = load_vec(x + j);
    acc = v > acc ? v : acc;
  }
  const float lanes = fold_lanes(acc, [](Vec a, Vec b) { return b > a ? b : a; });
  float best = lanes > init ? lanes : init;
  for (; j < n; ++j) best = x[j] > best ? x[j] : best;
  return best;
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
