// The dense loops of the CPU backend on contiguous float tiles. Each innermost loop runs along a
// contiguous row and is no reduction, so -O3 vectorises it without -ffast-math; reductions use
// a fixed set of lanes, so results are identical run to run and thread to thread.
//
// Notation: rows index query rows of a tile, cols index keys, dim the head dimension. A `ranges`
// array gives, per query row, the key columns [begin, end) it may see; entries outside are never
// read or used, so a NaN in a key a row cannot see never reaches that row.
#pragma once

#include <cstdint>
#include <limits>

#include "cpu/mask.h"

namespace fusedattn::cpu {

inline constexpr int kLanes = 8;        // independent partial sums/maxima of a row reduction
inline constexpr int kRowsPerPass = 4;  // query rows sharing one pass over a transposed tile
inline constexpr int kKeysPerPass = 4;  // key rows folded into an accumulator row per pass

// s[r * lds + j] = sum_d a[r * dim + d] * bt[d * ldb + j] for r < rows, j < cols.
// (S = Q K^T with K pre-transposed, or dP = dO V^T with V pre-transposed.)
inline void matmul_transposed_b(const float* a, int rows, int dim, const float* bt, int ldb, int cols, float* s,
                                int lds) {
  int r = 0;
  for (; r + kRowsPerPass <= rows; r += kRowsPerPass) {
    float* __restrict s0 = s + int64_t{r} * lds;
    float* __restrict s1 = s0 + lds;
    float* __restrict s2 = s1 + lds;
    float* __restrict s3 = s2 + lds;
    const float* a0 = a + int64_t{r} * dim;
    for (int j = 0; j < cols; ++j) s0[j] = s1[j] = s2[j] = s3[j] = 0.f;
    for (int d = 0; d < dim; ++d) {
      const float* __restrict b = bt + int64_t{d} * ldb;
      const float x0 = a0[d], x1 = a0[dim + d], x2 = a0[2 * dim + d], x3 = a0[3 * dim + d];
      for (int j = 0; j < cols; ++j) {
        s0[j] += x0 * b[j];
        s1[j] += x1 * b[j];
        s2[j] += x2 * b[j];
        s3[j] += x3 * b[j];
      }
    }
  }
  for (; r < rows; ++r) {
    float* __restrict s0 = s + int64_t{r} * lds;
    const float* a0 = a + int64_t{r} * dim;
    for (int j = 0; j < cols; ++j) s0[j] = 0.f;
    for (int d = 0; d < dim; ++d) {
      const float* __restrict b = bt + int64_t{d} * ldb;
      const float x0 = a0[d];
      for (int j = 0; j < cols; ++j) s0[j] += x0 * b[j];
    }
  }
}

// c[r * dim + :] += sum_{j in ranges[r]} p[r * ldp + j] * b[j * dim + :].
// (O += P V, dQ += dS K.) Keys are folded in order j = begin, begin + 1, ...; the unrolled form
// keeps c[r] in registers across kKeysPerPass keys without changing that order.
inline void accumulate_pb(const float* p, int ldp, const ColRange* ranges, int rows, const float* b, int dim,
                          float* c) {
  for (int r = 0; r < rows; ++r) {
    float* __restrict cr = c + int64_t{r} * dim;
    const float* pr = p + int64_t{r} * ldp;
    int j = ranges[r].begin;
    const int end = ranges[r].end;
    for (; j + kKeysPerPass <= end; j += kKeysPerPass) {
      const float p0 = pr[j], p1 = pr[j + 1], p2 = pr[j + 2], p3 = pr[j + 3];
      const float* __restrict b0 = b + int64_t{j} * dim;
      const float* __restrict b1 = b0 + dim;
      const float* __restrict b2 = b1 + dim;
      const float* __restrict b3 = b2 + dim;
      for (int d = 0; d < dim; ++d) cr[d] = cr[d] + p0 * b0[d] + p1 * b1[d] + p2 * b2[d] + p3 * b3[d];
    }
    for (; j < end; ++j) {
      const float p0 = pr[j];
      const float* __restrict b0 = b + int64_t{j} * dim;
      for (int d = 0; d < dim; ++d) cr[d] += p0 * b0[d];
    }
  }
}

// c[j * dim + :] += sum_{r : j in ranges[r]} p[r * ldp + j] * a[r * dim + :] for j < cols.
// (dV += P^T dO, dK += dS^T Q.) Rows are folded in order r = 0, 1, ... for every key j.
inline void accumulate_ptb(const float* p, int ldp, const ColRange* ranges, int rows, const float* a, int dim,
                           int cols, float* c) {
  for (int j = 0; j < cols; ++j) {
    float* __restrict cj = c + int64_t{j} * dim;
    for (int r = 0; r < rows; ++r) {
      if (j < ranges[r].begin || j >= ranges[r].end) continue;
      const float pj = p[int64_t{r} * ldp + j];
      const float* __restrict ar = a + int64_t{r} * dim;
      for (int d = 0; d < dim; ++d) cj[d] += pj * ar[d];
    }
  }
}

// Fixed-lane sum of x[0, n): the same association for the same n, whatever the thread.
inline float lane_sum(const float* x, int n) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l];
  float total = 0.f;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  for (; j < n; ++j) total += x[j];
  return total;
}

// sum_d x[d] * y[d], with the lanes of lane_sum.
inline float lane_dot(const float* x, const float* y, int n) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l] * y[j + l];
  float total = 0.f;
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  for (; j < n; ++j) total += x[j] * y[j];
  return total;
}

// max(init, x[0, n)), skipping NaNs (`v > acc` is false for them). A NaN score still poisons its
// row, through exp2(NaN - max) in the softmax; skipping it here only keeps the max finite.
inline float lane_max(const float* x, int n, float init) {
  float acc[kLanes];
  for (float& a : acc) a = init;
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
  float best = init;
  for (int l = 0; l < kLanes; ++l) best = acc[l] > best ? acc[l] : best;
  for (; j < n; ++j) best = x[j] > best ? x[j] : best;
  return best;
}

}  // namespace fusedattn::cpu
