// Online softmax over the rows a thread holds in mma.m16n8k16 C-fragment layout: for each m16
// tile, rows g and g + 8 (h = 0, 1); the four threads of a quad (same g) share a row, so row
// reductions are two xor-shuffles. Works in the log2 domain: scores stay raw and scale_log2 =
// scale * log2(e) is folded into one FMA before exp2, so no separate scaling pass.
// Normalisation is deferred: rows keep an unnormalised O and a running sum until finalize().
#pragma once

#include <cmath>

#include "cuda/ptx/ex2.cuh"

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

// The row maximum in scaled log2 units, with a fully masked row (max = -inf) mapped to 0 so that
// exp2(s * scale_log2 - max) computes exp2(-inf) = 0 instead of -inf - (-inf) = NaN.
__device__ __forceinline__ float safe_scaled_max(float row_max, float scale_log2) {
  return row_max == -INFINITY ? 0.f : row_max * scale_log2;
}

template <int kMTiles>
struct OnlineSoftmax {
  float row_max[kMTiles][2];  // running max of raw scores; -inf until a visible key is seen
  float row_sum[kMTiles][2];  // this thread's partial sum of exp2; quad-reduced in finalize()
  float correction[kMTiles][2];  // exp2(previous max - current max), scaled, of the last update

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[mt][h] = -INFINITY;
        row_sum[mt][h] = 0.f;
      }
  }

  // One KV block: updates the maxima, turns the scores in s into unnormalised probabilities P
  // (fp32, in place) and keeps the factor exp2(old max - new max) by which the caller must rescale
  // O (rescale_o). The rescale is separate so it can run after P is packed to 16 bits, when S's
  // registers are free; on the first block (kFirst) O is still zero and needs none.
  template <bool kFirst, int kNTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4], float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float block_max = row_max[mt][h];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          block_max = fmaxf(block_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        const float new_max = quad_max(block_max);
        const float scaled_max = safe_scaled_max(new_max, scale_log2);
        if (!kFirst) {
          // A row with no visible key so far has O = 0 and sum = 0: its correction must be 0, not
          // exp2(0 - new max), which overflows to inf for very negative logits (0 * inf = NaN).
          const float old_max = row_max[mt][h];
          correction[mt][h] = old_max == -INFINITY ? 0.f : ptx::ex2_approx(old_max * scale_log2 - scaled_max);
          row_sum[mt][h] *= correction[mt][h];
        }
        row_max[mt][h] = new_max;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[mt][nt][2 * h + e];
            x = ptx::ex2_approx(fmaf(x, scale_log2, -scaled_max));
            sum += x;
          }
        row_sum[mt][h] += sum;
      }
  }

  // O *= the corrections of the last update (not after a kFirst update).
  template <int kDTiles>
  __device__ __forceinline__ void rescale_o(float (&o)[kMTiles][kDTiles][4]) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mt][dt][i] *= correction[mt][i / 2];  // C layout: i / 2 = h
  }

  // Completes the row sums; returns per row the factor that normalises O (0 for a fully masked
  // row, whose O is 0, so out is 0 and never 0 * inf) and the natural-log LSE (-inf for a fully
  // masked row).
  __device__ __forceinline__ void finalize(float scale_log2, float (&inv_sum)[kMTiles][2],
                                           float (&lse)[kMTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float sum = quad_sum(row_sum[mt][h]);
        const bool empty = sum == 0.f;
        inv_sum[mt][h] = empty ? 0.f : 1.f / sum;
        lse[mt][h] = empty ? -INFINITY : (row_max[mt][h] * scale_log2 + log2f(sum)) * kLn2;
      }
  }
};

}  // namespace fusedattn::cuda
