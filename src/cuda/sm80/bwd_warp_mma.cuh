// Warp-level GEMMs of the sm80 backward, built on ldmatrix + mma.m16n8k16 (fragment layouts in
// cuda/ptx/mma_sm80.cuh and cuda/ptx/ldmatrix.cuh). All shared tiles are row-major and swizzled.
// A warp's C tile is [16 x kN] as kN/8 n8 fragments: c[j][0..1] = row g, columns 8j + 2t, +1;
// c[j][2..3] = row g + 8 (lane l: g = l / 4, t = l % 4).
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mma_sm80.cuh"
#include "cuda/sm80/bwd_tile.h"

namespace fusedattn::cuda::sm80 {

template <int kPitch, typename Element>
__device__ __forceinline__ uint32_t tile_addr(uint32_t tile, int row, int col) {
  return tile + swizzle_offset(row, col, kPitch) * sizeof(Element);
}

// A fragment of rows [row0, row0 + 16) x columns [k0, k0 + 16) of a tile stored [m][k].
// Matrices 0..3 of ldmatrix.x4 are (rows 0-7 | 8-15) x (cols 0-7), then x (cols 8-15): a[0..3].
template <int kPitch, typename Element>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int row0, int k0) {
  const int lane = threadIdx.x % kWarpSize;
  ptx::ldmatrix_x4(a, tile_addr<kPitch, Element>(tile, row0 + lane % 16, k0 + lane / 16 * 8));
}

// A fragment of the [m][k] operand whose transpose is stored ([k][m], e.g. dS^T): .trans turns
// stored 8x8 blocks (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7), (k 8-15, m 8-15) into a[0..3].
template <int kPitch, typename Element>
__device__ __forceinline__ void load_a_transposed(uint32_t (&a)[4], uint32_t tile, int m0, int k0) {
  const int lane = threadIdx.x % kWarpSize;
  ptx::ldmatrix_x4_trans(a, tile_addr<kPitch, Element>(tile, k0 + lane / 16 * 8 + lane % 8, m0 + lane / 8 % 2 * 8));
}

// B fragments of two adjacent n8 tiles (n0 and n0 + 8), k in [k0, k0 + 16), from a tile stored
// [n][k] (k contiguous, e.g. Q for S^T = K Q^T): b[0..1] for tile n0, b[2..3] for n0 + 8.
template <int kPitch, typename Element>
__device__ __forceinline__ void load_b_pair_nk(uint32_t (&b)[4], uint32_t tile, int n0, int k0) {
  const int lane = threadIdx.x % kWarpSize;
  ptx::ldmatrix_x4(b, tile_addr<kPitch, Element>(tile, n0 + lane / 16 * 8 + lane % 8, k0 + lane / 8 % 2 * 8));
}

// The same from a tile stored [k][n] (n contiguous, e.g. dO for dV = P^T dO), transposed on load.
template <int kPitch, typename Element>
__device__ __forceinline__ void load_b_pair_kn(uint32_t (&b)[4], uint32_t tile, int k0, int n0) {
  const int lane = threadIdx.x % kWarpSize;
  ptx::ldmatrix_x4_trans(b, tile_addr<kPitch, Element>(tile, k0 + lane / 8 % 2 * 8 + lane % 8, n0 + lane / 16 * 8));
}

template <typename Element>
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  ptx::mma_m16n8k16<Element>(c0, a, b0);
  ptx::mma_m16n8k16<Element>(c1, a, b1);
}

// c[16 x kN] = A[rows a_row0.., 0..kK) * B^T, B stored [n][k] (both operands from shared).
template <int kN, int kK, int kPitchA, int kPitchB, typename Element>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[kN / kMmaCols][4], uint32_t tile_a, int a_row0, uint32_t tile_b) {
#pragma unroll
  for (int j = 0; j < kN / kMmaCols; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) {
    uint32_t a[4];
    load_a<kPitchA, Element>(a, tile_a, a_row0, kb * kMmaK);
#pragma unroll
    for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
      uint32_t b[4];
      load_b_pair_nk<kPitchB, Element>(b, tile_b, np * 2 * kMmaCols, kb * kMmaK);
      mma_pair<Element>(c[2 * np], c[2 * np + 1], a, b);
    }
  }
}

// c[16 x kN] += A * B where A [16 x kK] is a C-layout fp32 register tile (rounded to Element on
// the fly: two adjacent n8 C fragments are exactly one k16 A fragment) and B is stored [k][n]
// starting at column n0.
template <int kN, int kK, int kPitchB, typename Element>
__device__ __forceinline__ void warp_gemm_rab(float (&c)[kN / kMmaCols][4], const float (&a_acc)[kK / kMmaCols][4],
                                              uint32_t tile_b, int n0) {
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) {
    const float(&lo)[4] = a_acc[2 * kb];
    const float(&hi)[4] = a_acc[2 * kb + 1];
    const uint32_t a[4] = {pack2<Element>(lo[0], lo[1]), pack2<Element>(lo[2], lo[3]), pack2<Element>(hi[0], hi[1]),
                           pack2<Element>(hi[2], hi[3])};
#pragma unroll
    for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
      uint32_t b[4];
      load_b_pair_kn<kPitchB, Element>(b, tile_b, kb * kMmaK, n0 + np * 2 * kMmaCols);
      mma_pair<Element>(c[2 * np], c[2 * np + 1], a, b);
    }
  }
}

// c[kRowTiles*16 x kN] = A * B with A's transpose stored [k][m] (rows m0..) and B stored [k][n]
// (columns n0..), k over [0, kK).
template <int kRowTiles, int kN, int kK, int kPitchA, int kPitchB, typename Element>
__device__ __forceinline__ void warp_gemm_atb(float (&c)[kRowTiles][kN / kMmaCols][4], uint32_t tile_a, int m0,
                                              uint32_t tile_b, int n0) {
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kN / kMmaCols; ++j) c[mi][j][0] = c[mi][j][1] = c[mi][j][2] = c[mi][j][3] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) {
    uint32_t a[kRowTiles][4];
#pragma unroll
    for (int mi = 0; mi < kRowTiles; ++mi)
      load_a_transposed<kPitchA, Element>(a[mi], tile_a, m0 + mi * kMmaRows, kb * kMmaK);
#pragma unroll
    for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
      uint32_t b[4];
      load_b_pair_kn<kPitchB, Element>(b, tile_b, kb * kMmaK, n0 + np * 2 * kMmaCols);
#pragma unroll
      for (int mi = 0; mi < kRowTiles; ++mi) mma_pair<Element>(c[mi][2 * np], c[mi][2 * np + 1], a[mi], b);
    }
  }
}

}  // namespace fusedattn::cuda::sm80
