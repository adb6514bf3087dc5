// Online softmax over the rows a thread holds in a wgmma accumulator (two rows per thread, the
// four lanes of a quad share a row; layout in ptx/wgmma.cuh). Works in log2 units:
// exp(scale * s) = exp2(scale_log2 * s), one FFMA + EX2 per score.
#pragma once

#include <cfloat>
#include <cmath>

// quad_max / quad_sum (the four lanes 4r .. 4r+3 of a quad hold one row) and finalize_row.
#include "cuda/common/element.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/ptx/mufu.cuh"

namespace fusedattn::cuda::sm90 {

// Per-row factors for the O accumulated so far; `any` (the same in every lane of a warp) is false
// when all of them are 1, so the rescale can be skipped.
struct RowCorrection {
  float factor[2];
  bool any;
};

struct OnlineSoftmax {
  static constexpr int kRows = 2;
  // Each method takes kLive, the thread's rows in use: 2, or 1 where a slice's rows in use all lie
  // in the first 8 of each warp's 16 (decode steps: a packed GQA group of up to 8 query heads at one
  // position), so every thread's second row (lane / 4 + 8) is past them. Its scores are then left
  // as they are, its statistics keep reset()'s values (finalize: output 0, LSE -inf, never
  // stored), and its RowCorrection factor is not set (rescale_rows<kLive> reads the live rows'
  // only; keep_reference sets both): the softmax's dependent chain, on the critical path where no other warpgroup's GEMMs
  // hide it, halves (Consumer::kOneRowCopy).
  // Running max of scale_log2 * s (log2 units); kNoKeyMax until a key is seen. A finite floor
  // rather than -inf, so update() needs no per-block test for rows without keys. It is the lowest
  // finite float: any finite block max moves the max off it or equals it (then it is the max).
  static constexpr float kNoKeyMax = -FLT_MAX;
  float row_max[kRows];
  float row_sum[kRows];  // this thread's partial sum of exp2(...); reduced over the quad at the end

  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = kNoKeyMax;
      row_sum[r] = 0.f;
    }
  }

  // The largest of row r's values in a quad's accumulators, one FMNMX per value: seeded with the
  // row's first pair rather than -inf (fmaxf(-inf, x) is no identity for ptxas: it keeps the op).
  template <int kAcc>
  __device__ __forceinline__ static float quad_row_max(const float (&s)[kAcc], int r) {
    float mx = fmaxf(s[2 * r], s[2 * r + 1]);
#pragma unroll
    for (int j = 1; j < kAcc / 4; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    return quad_max(mx);
  }

  // Turns scores s into unnormalised probabilities in place and sets, per row, the factor by
  // which the O accumulated so far must be rescaled. Requires scale_log2 > 0. The running max
  // moves only when the block's max exceeds it by more than `slack` (log2 units); otherwise the
  // stale max stays the reference (probabilities up to 2^slack, as precise in fp16/bf16/fp32) and the
  // factor is 1. The output and LSE do not depend on which max is used, only the work does:
  // after the first blocks a row's max rarely moves that far, so O's rescale is mostly skipped.
  template <int kLive = kRows, int kAcc>
  __device__ __forceinline__ void update(float (&s)[kAcc], float scale_log2, float slack, RowCorrection& c) {
    static_assert(kLive == 1 || kLive == kRows);
    bool moved = false;
#pragma unroll
    for (int r = 0; r < kLive; ++r) {
      const float m_block = quad_row_max(s, r) * scale_log2;
      // kNoKeyMax + slack rounds to kNoKeyMax: a row's first visible key moves the max. A row that
      // has seen only masked keys (block max -inf) keeps the finite floor, so the subtraction
      // below never meets -inf - (-inf) = NaN, and exp2(-inf) = 0 keeps its probabilities and
      // sum at 0.
      const bool move = m_block > row_max[r] + slack;
      const float m_new = move ? m_block : row_max[r];
      c.factor[r] = move ? ptx::ex2_approx(row_max[r] - m_new) : 1.f;
      row_max[r] = m_new;
      moved = moved || move;
      // Seeded with the first probability rather than 0 (0.f + x is kept: it maps -0 to +0).
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * r + e];
          x = ptx::ex2_approx(fmaf(x, scale_log2, -m_new));
          sum = j == 0 && e == 0 ? x : sum + x;
        }
      row_sum[r] = row_sum[r] * c.factor[r] + sum;
    }
    // Warp-uniform, so skipping the rescale never splits the warp.
    c.any = __any_sync(kFullWarpMask, moved);
  }

  // The common step without the row max: probabilities against the current reference max, each
  // pair (columns 4j + 2r, +1 of row r) handed to keep(j, r, x0, x1), and the block's partial row
  // sums into `sum`. Every probability is at most its row's partial sum, so when no lane's
  // partial sum exceeds sum_limit = 2^slack the reference may stay (each probability <= 2^slack,
  // update()'s invariant: keep_reference). Returns whether some lane's sum exceeded it (the same
  // in every lane of the warp). It saves the max's FMNMX chain and shuffles: the row max is needed
  // only when it moves. A NaN sum passes the test and stays in its row, as with update().
  template <int kLive, int kAcc, class Keep>
  __device__ __forceinline__ bool exps_over_limit(const float (&s)[kAcc], float scale_log2, float sum_limit,
                                                  float (&sum)[kRows], Keep keep) const {
    bool over = false;
#pragma unroll
    for (int r = 0; r < kLive; ++r) {
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        const float x0 = ptx::ex2_approx(fmaf(s[4 * j + 2 * r], scale_log2, -row_max[r]));
        const float x1 = ptx::ex2_approx(fmaf(s[4 * j + 2 * r + 1], scale_log2, -row_max[r]));
        keep(j, r, x0, x1);
        sum[r] = j == 0 ? x0 + x1 : sum[r] + (x0 + x1);
      }
      over = over || sum[r] > sum_limit;
    }
    return __any_sync(kFullWarpMask, over);
  }

  // The reference max stays: the block's sums are added and every factor is 1.
  template <int kLive>
  __device__ __forceinline__ void keep_reference(const float (&sum)[kRows], RowCorrection& c) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < kLive) row_sum[r] += sum[r];
      c.factor[r] = 1.f;
    }
    c.any = false;
  }

  // exps_over_limit packing P straight into a second buffer (pair i = 2j + r, as
  // Consumer::convert_p) with S left intact: false sends the warp to update().
  template <typename Element, int kLive = kRows, int kAcc, int kPRegs>
  __device__ __forceinline__ bool update_unless_moved(const float (&s)[kAcc], uint32_t (&p)[kPRegs], float scale_log2,
                                                      float sum_limit, RowCorrection& c) {
    static_assert(kPRegs * 2 == kAcc);
    float sum[kRows];
    if (exps_over_limit<kLive>(s, scale_log2, sum_limit, sum,
                               [&](int j, int r, float x0, float x1) { p[2 * j + r] = pack2<Element>(x0, x1); }))
      return false;
    keep_reference<kLive>(sum, c);
    return true;
  }

  // exps_over_limit writing the probabilities over S (Consumer::kSumCheckInPlace: tiles with one
  // P buffer, which P V still reads, and masked launches). When a sum exceeds the limit the block's row max is recovered from the
  // probabilities: q, the largest of a row's, is 2^(block max - reference), so a row whose max
  // moved by more than slack (q > 2^slack, update()'s decision) takes reference + log2 q and its
  // probabilities, sum and O are scaled by 1/q. Returns false, with S lost, only if some q of the
  // warp is above rebase_limit (kRebaseLimit; an overflow to inf included: a score more than 128
  // log2 units above the stale reference, or a row that has seen no key yet): the caller
  // computes S again and runs update().
  template <int kLive = kRows, int kAcc>
  __device__ __forceinline__ bool update_in_place_unless_moved(float (&s)[kAcc], float scale_log2, float sum_limit,
                                                               float rebase_limit, RowCorrection& c) {
    float sum[kRows];
    if (!exps_over_limit<kLive>(s, scale_log2, sum_limit, sum, [&](int j, int r, float x0, float x1) {
          s[4 * j + 2 * r] = x0;
          s[4 * j + 2 * r + 1] = x1;
        })) {
      keep_reference<kLive>(sum, c);
      return true;
    }
    float q[kRows];
    bool rebasable = true;
#pragma unroll
    for (int r = 0; r < kLive; ++r) {
      q[r] = quad_row_max(s, r);
      rebasable = rebasable && q[r] <= rebase_limit;
    }
    if (!__all_sync(kFullWarpMask, rebasable)) return false;
    bool moved = false;
#pragma unroll
    for (int r = 0; r < kLive; ++r) {
      const bool move = q[r] > sum_limit;
      c.factor[r] = move ? ptx::rcp_approx(q[r]) : 1.f;
      if (move) row_max[r] += ptx::lg2_approx(q[r]);
      row_sum[r] = (row_sum[r] + sum[r]) * c.factor[r];
      moved = moved || move;
    }
    c.any = __any_sync(kFullWarpMask, moved);
    if (c.any) {
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
        for (int e = 0; e < 2 * kLive; ++e) s[4 * j + e] *= c.factor[e / 2];
    }
    return true;
  }

  // 1 / rowsum for the output and the natural-log LSE (finalize_row: a fully masked row, sum 0,
  // gets output 0 and LSE -inf; the reference row_max only ever takes a block's max, so a row that
  // saw a key has sum >= 1, and each probability is <= 2^slack).
  __device__ __forceinline__ void finalize(float (&inv_sum)[kRows], float (&lse)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) finalize_row(quad_sum(row_sum[r]), row_max[r], inv_sum[r], lse[r]);
  }
};

// O *= correction, per row, on a 64 x N accumulator (the thread's first kLive rows: the others
// stay as they are).
template <int kLive = OnlineSoftmax::kRows, int kAcc>
__device__ __forceinline__ void rescale_rows(float (&o)[kAcc], const float (&factor)[2]) {
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j)
#pragma unroll
    for (int e = 0; e < 2 * kLive; ++e) o[4 * j + e] *= factor[e / 2];
}

// O *= the correction, unless every factor of the warp is 1.
template <int kLive = OnlineSoftmax::kRows, int kAcc>
__device__ __forceinline__ void apply_correction(float (&o)[kAcc], const RowCorrection& c) {
  if (c.any) rescale_rows<kLive>(o, c.factor);
}

}  // namespace fusedattn::cuda::sm90
