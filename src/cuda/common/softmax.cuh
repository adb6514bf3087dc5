// Online softmax over the rows a thread holds in mma.m16n8k16 C-fragment layout: for each m16
// tile, rows g and g + 8 (h = 0, 1); the four threads of a quad (same g) share a row, so row
// reductions are two xor-shuffles. Works in the log2 domain: scores stay raw and scale_log2 =
// scale * log2(e) is folded into one FMA before exp2, so no separate scaling pass.
// Normalisation is deferred: rows keep an unnormalised O and a running sum until finalize().
#pragma once

#include <cmath>

#include "cuda/ptx/mufu.cuh"

namespace fusedattn::cuda {

constexpr float kLn2 = 0.69314718055994530942f;
constexpr unsigned kFullWarpMask = 0xffffffffu;

// Max / sum over the 4 threads of a quad (lanes differing in bits 0 and 1).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullWarpMask, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullWarpMask, x, 1);
  return x + __shfl_xor_sync(kFullWarpMask, x, 2);
}

// A row's final factors from its quad-reduced sum and its running max (log2 units): the factor
// that normalises O (0 for a fully masked row, whose O is 0, so out is 0 and never 0 * inf) and
// the natural-log LSE (-inf for a fully masked row); a NaN sum stays NaN in both, confined to its
// row. A row that saw a key has sum >= 1 (the key at its true max contributes 2^(max - reference)
// >= 1, the reference never exceeding the max) and far below overflow, so the hardware reciprocal
// and log2 (MUFU.RCP, MUFU.LG2: about 1 ulp, 2^-22 absolute) replace the IEEE division and the libm
// log2f with their range handling; no subnormal sum reaches them. Both kernels' softmaxes end here.
__device__ __forceinline__ void finalize_row(float sum, float max_log2, float& inv_sum, float& lse) {
  const bool empty = sum == 0.f;
  inv_sum = empty ? 0.f : ptx::rcp_approx(sum);
  lse = empty ? -INFINITY : (max_log2 + ptx::lg2_approx(sum)) * kLn2;
}

// Per-row factors by which the O accumulated so far must be rescaled after an update; `any` (the
// same in every lane of a warp) is false when all of them are 1, so the rescale can be skipped.
template <int kMTiles>
struct RowCorrection {
  float factor[kMTiles][2];
  bool any;
};

template <int kMTiles>
struct OnlineSoftmax {
  float row_max[kMTiles][2];  // running reference max of scale_log2 * s; -inf until a visible key is seen
  float row_sum[kMTiles][2];  // this thread's partial sum of exp2; quad-reduced in finalize()

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = -INFINITY;
        row_sum[mt][h] = 0.f;
      }
  }

  // One block of keys: turns the scores in s into unnormalised probabilities P (fp32, in place)
  // and sets in c the factors by which the caller must rescale O (rescale_o). The reference max
  // moves only when the block's max exceeds it by more than `slack` (log2 units); otherwise the
  // stale max stays (probabilities up to 2^slack, as precise in fp16/bf16/fp32) and the factor is
  // 1. The output and LSE do not depend on which max is the reference, only the work does: after
  // the first blocks a row's max rarely moves that far, so the rescale of O is mostly skipped.
  // kFirst: O and the sums are still zero, so no factor is needed. Requires scale_log2 > 0.
  template <bool kFirst, int kNTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float scale_log2, float slack,
                                         RowCorrection<kMTiles>& c) {
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // Seeded with the row's first pair, not -inf: ptxas keeps fmaxf(-inf, x) (x may be NaN).
        float block_max = fmaxf(s[mt][0][2 * h], s[mt][0][2 * h + 1]);
#pragma unroll
        for (int nt = 1; nt < kNTiles; ++nt)
          block_max = fmaxf(block_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        const float m_block = quad_max(block_max) * scale_log2;
        // -inf + slack stays -inf: a row's first visible key always moves the max.
        const bool move = kFirst || m_block > row_max[mt][h] + slack;
        const float m_new = move ? m_block : row_max[mt][h];
        // A row that has seen only masked keys keeps max -inf; subtracting 0 instead avoids
        // -inf - (-inf) = NaN, and exp2(-inf) = 0 keeps its probabilities and sum at 0. Its
        // factor exp2(-inf - m) is 0, never exp2(0 - m), which overflows for very negative logits.
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        if (!kFirst) {
          c.factor[mt][h] = move ? ptx::ex2_approx(row_max[mt][h] - m_use) : 1.f;
          row_sum[mt][h] *= c.factor[mt][h];
          moved = moved || move;
        }
        row_max[mt][h] = m_new;
        // Seeded with the first probability, not 0: ptxas keeps 0 + x (x may be -0).
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * h + e];
            x = ptx::ex2_approx(fmaf(x, scale_log2, -m_use));
            sum = nt == 0 && e == 0 ? x : sum + x;
          }
        row_sum[mt][h] += sum;
      }
    // Warp-uniform, so skipping the rescale never splits the warp.
    if (!kFirst) c.any = __any_sync(kFullWarpMask, moved);
  }

  // O *= the factors of an update (not after a kFirst update). kSkipUnit: not when all of the
  // warp's factors are 1 (a warp-uniform branch, which costs registers where O is large).
  template <bool kSkipUnit, int kDTiles>
  static __device__ __forceinline__ void rescale_o(float (&o)[kMTiles][kDTiles][4], const RowCorrection<kMTiles>& c) {
    if (kSkipUnit && !c.any) return;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mt][dt][i] *= c.factor[mt][i / 2];  // C layout: i / 2 = h
  }

  // Completes the row sums; returns per row the factor that normalises O and the natural-log LSE
  // (finalize_row).
  __device__ __forceinline__ void finalize(float (&inv_sum)[kMTiles][2], float (&lse)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) finalize_row(quad_sum(row_sum[mt][h]), row_max[mt][h], inv_sum[mt][h], lse[mt][h]);
  }
};

}  // namespace fusedattn::cuda
