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
#include "cuda/ptx/stmatrix.cuh"
#include "cuda/sm80/bwd_tile.h"

namespace fusedattn::cuda::sm80 {

// Addressing. An ldmatrix.x4 reads a 16x16 block as four 8x8 matrices; lane l gives the row
// address for matrix l / 8. Two matrix orders cover every operand (cuda/ptx/mma_sm80.cuh):
//   kRowsFirst: (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 8-15)
//               A from a [m][k] tile; B pair from a [k][n] tile with .trans
//   kColsFirst: (rows 0-7, cols 0-7), (rows 0-7, cols 8-15), (rows 8-15, cols 0-7), (rows 8-15, cols 8-15)
//               B pair from a [n][k] tile; A from a [k][m] tile with .trans
// For a block whose first row is a multiple of 8, the swizzle (chunk ^ row % 8) depends only on
// the lane, so each lane precomputes its offset for the block at (row 0, column pair 0) once;
// column pair `pair` (16 columns) then only flips bits 5-6 of it and adds whole 128-byte groups.
// This keeps the hot loops at one LOP3 + an immediate offset per ldmatrix, instead of hoisting
// a full address per (k step, n step) into registers.
// A B operand read from the Q/dO stage buffers may instead take the XOR on the lane's full
// address in the tile (kStagedB; BwdShared aligns every tile to a 128-byte swizzle group, so the
// address is the same): where the stage changes every iteration, its swizzled addresses are then
// no loop-invariant per-lane values that ptxas hoists out of the main loop and spills (d128 on
// sm_80: 8 bytes), but one add and XOR per pair class and iteration.
enum class LdsmOrder { kRowsFirst, kColsFirst };

template <int kPitch, typename Element, LdsmOrder kOrder>
__device__ __forceinline__ uint32_t ldsm_lane_offset() {
  const int lane = threadIdx.x % kWarpSize;
  const int row = kOrder == LdsmOrder::kRowsFirst ? lane % 16 : lane / 16 * 8 + lane % 8;
  const int chunk = kOrder == LdsmOrder::kRowsFirst ? lane / 16 : lane / 8 % 2;
  return static_cast<uint32_t>(swizzle_offset(row, chunk * kSwizzleChunkElems, kPitch) * sizeof(Element));
}

constexpr int kPairsPerSwizzleGroup = kSwizzlePitchMultiple / (2 * kSwizzleChunkElems);  // 4
constexpr uint32_t kPairBytes = 2 * kSwizzleChunkElems * 2;                               // 32 (16-bit elements)
constexpr uint32_t kGroupBytes = kSwizzlePitchMultiple * 2;                               // 128

// Shared address of the 16x16 block at (row0, 16 * pair) for this lane; row0 % 8 == 0. With
// kXorAddress the tile is 128-byte aligned and the XOR goes onto tile + lane_offset.
template <int kPitch, typename Element, bool kXorAddress = false>
__device__ __forceinline__ uint32_t ldsm_addr(uint32_t tile, uint32_t lane_offset, int row0, int pair) {
  static_assert(sizeof(Element) == 2, "16-bit elements");
  if constexpr (kXorAddress)
    return ((tile + lane_offset) ^ (static_cast<uint32_t>(pair % kPairsPerSwizzleGroup) * kPairBytes)) +
           static_cast<uint32_t>(row0 * kPitch * sizeof(Element)) +
           static_cast<uint32_t>(pair / kPairsPerSwizzleGroup) * kGroupBytes;
  else
    return tile + static_cast<uint32_t>(row0 * kPitch * sizeof(Element)) +
           static_cast<uint32_t>(pair / kPairsPerSwizzleGroup) * kGroupBytes +
           (lane_offset ^ (static_cast<uint32_t>(pair % kPairsPerSwizzleGroup) * kPairBytes));
}

// Per-lane offsets of one tile pitch, for both matrix orders.
struct LdsmLane {
  uint32_t rows_first, cols_first;
};
template <int kPitch, typename Element>
__device__ __forceinline__ LdsmLane ldsm_lane() {
  return {ldsm_lane_offset<kPitch, Element, LdsmOrder::kRowsFirst>(),
          ldsm_lane_offset<kPitch, Element, LdsmOrder::kColsFirst>()};
}

template <typename Element>
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  ptx::mma_m16n8k16<Element>(c0, a, b0);
  ptx::mma_m16n8k16<Element>(c1, a, b1);
}

// How the B operand of a warp GEMM sits in shared memory: [n][k] (B^T row-major: plain
// ldmatrix) or [k][n] (ldmatrix.trans).
enum class BStorage { kNK, kKN };

// c[kRowTiles*16 x kN] += A[rows a_row0.., 0..kK) * B, A stored [m][k] in shared, B in shared as
// kB says: [n][k] from row b0, or [k][n] from column 16 * b0. Every B fragment feeds kRowTiles MMAs.
// kStagedB: B is a Q/dO stage buffer addressed with the XOR on the full address (ldsm_addr).
template <BStorage kB, int kRowTiles, int kN, int kK, int kPitchA, int kPitchB, typename Element, bool kStagedB = false>
__device__ __forceinline__ void warp_gemm_shared_ab(float (&c)[kRowTiles][kN / kMmaCols][4], uint32_t tile_a,
                                                    LdsmLane lane_a, int a_row0, uint32_t tile_b, LdsmLane lane_b,
                                                    int b0) {
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) {
    uint32_t a[kRowTiles][4];
#pragma unroll
    for (int mi = 0; mi < kRowTiles; ++mi)
      ptx::ldmatrix_x4(a[mi], ldsm_addr<kPitchA, Element>(tile_a, lane_a.rows_first, a_row0 + mi * kMmaRows, kb));
#pragma unroll
    for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
      uint32_t b[4];
      if constexpr (kB == BStorage::kNK)
        ptx::ldmatrix_x4(b, ldsm_addr<kPitchB, Element, kStagedB>(tile_b, lane_b.cols_first, b0 + np * 2 * kMmaCols, kb));
      else
        ptx::ldmatrix_x4_trans(b, ldsm_addr<kPitchB, Element, kStagedB>(tile_b, lane_b.rows_first, kb * kMmaK, b0 + np));
#pragma unroll
      for (int mi = 0; mi < kRowTiles; ++mi) mma_pair<Element>(c[mi][2 * np], c[mi][2 * np + 1], a[mi], b);
    }
  }
}

// c[kRowTiles*16 x kN] = A[rows a_row0.., 0..kK) * B[rows b_row0.., 0..kK)^T, A stored [m][k],
// B stored [n][k], both in shared. kAccumulate: c += instead.
template <int kRowTiles, int kN, int kK, int kPitchA, int kPitchB, typename Element, bool kAccumulate = false,
          bool kStagedB = false>
__device__ __forceinline__ void warp_gemm_abt(float (&c)[kRowTiles][kN / kMmaCols][4], uint32_t tile_a, LdsmLane lane_a,
                                              int a_row0, uint32_t tile_b, LdsmLane lane_b, int b_row0) {
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kN / kMmaCols; ++j)
      if constexpr (!kAccumulate) c[mi][j][0] = c[mi][j][1] = c[mi][j][2] = c[mi][j][3] = 0.f;
  warp_gemm_shared_ab<BStorage::kNK, kRowTiles, kN, kK, kPitchA, kPitchB, Element, kStagedB>(c, tile_a, lane_a, a_row0,
                                                                                             tile_b, lane_b, b_row0);
}

// Reads a warp's rows [row0, row0 + kRowTiles*16) x [0, kK) of a [m][k] shared tile as the A
// fragments of every k16 step, to be kept in registers (warp_gemm_rbt).
template <int kRowTiles, int kK, int kPitch, typename Element>
__device__ __forceinline__ void load_a_fragments(uint32_t (&a)[kRowTiles][kK / kMmaK][4], uint32_t tile, LdsmLane lane,
                                                 int row0) {
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int kb = 0; kb < kK / kMmaK; ++kb)
      ptx::ldmatrix_x4(a[mi][kb], ldsm_addr<kPitch, Element>(tile, lane.rows_first, row0 + mi * kMmaRows, kb));
}

// warp_gemm_abt with A already in registers (load_a_fragments): only B comes from shared memory.
template <int kRowTiles, int kN, int kK, int kPitchB, typename Element, bool kAccumulate = false, bool kStagedB = false>
__device__ __forceinline__ void warp_gemm_rbt(float (&c)[kRowTiles][kN / kMmaCols][4],
                                              const uint32_t (&a)[kRowTiles][kK / kMmaK][4], uint32_t tile_b,
                                              LdsmLane lane_b, int b_row0) {
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kN / kMmaCols; ++j)
      if constexpr (!kAccumulate) c[mi][j][0] = c[mi][j][1] = c[mi][j][2] = c[mi][j][3] = 0.f;
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb)
#pragma unroll
    for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, ldsm_addr<kPitchB, Element, kStagedB>(tile_b, lane_b.cols_first, b_row0 + np * 2 * kMmaCols, kb));
#pragma unroll
      for (int mi = 0; mi < kRowTiles; ++mi) mma_pair<Element>(c[mi][2 * np], c[mi][2 * np + 1], a[mi][kb], b);
    }
}

// A warp's key rows times B^T: from the register fragments `a` (load_a_fragments) when
// kFromRegisters, else from the [m][k] shared tile tile_a at rows a_row0.. (a unused).
template <bool kFromRegisters, int kRowTiles, int kN, int kK, int kPitch, typename Element, bool kAccumulate = false,
          bool kStagedB = false, int kFragmentTiles>
__device__ __forceinline__ void warp_gemm_rows_bt(float (&c)[kRowTiles][kN / kMmaCols][4],
                                                  const uint32_t (&a)[kFragmentTiles][kK / kMmaK][4], uint32_t tile_a,
                                                  int a_row0, uint32_t tile_b, LdsmLane lane, int b_row0) {
  if constexpr (kFromRegisters)
    warp_gemm_rbt<kRowTiles, kN, kK, kPitch, Element, kAccumulate, kStagedB>(c, a, tile_b, lane, b_row0);
  else
    warp_gemm_abt<kRowTiles, kN, kK, kPitch, kPitch, Element, kAccumulate, kStagedB>(c, tile_a, lane, a_row0, tile_b, lane,
                                                                                     b_row0);
}

// c[16 x kN] += A * B where A [16 x kK] is a C-layout fp32 register tile (rounded to Element on
// the fly: two adjacent n8 C fragments are exactly one k16 A fragment) and B is stored [k][n],
// rows from b_row0 (a multiple of 16), columns from 16 * pair0.
template <int kN, int kK, int kPitchB, typename Element, bool kStagedB = false>
__device__ __forceinline__ void warp_gemm_rab(float (&c)[kN / kMmaCols][4], const float (&a_acc)[kK / kMmaCols][4],
                                              uint32_t tile_b, LdsmLane lane_b, int b_row0, int pair0) {
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) {
    const float(&lo)[4] = a_acc[2 * kb];
    const float(&hi)[4] = a_acc[2 * kb + 1];
    const uint32_t a[4] = {pack2<Element>(lo[0], lo[1]), pack2<Element>(lo[2], lo[3]), pack2<Element>(hi[0], hi[1]),
                           pack2<Element>(hi[2], hi[3])};
#pragma unroll
    for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, ldsm_addr<kPitchB, Element, kStagedB>(tile_b, lane_b.rows_first, b_row0 + kb * kMmaK, pair0 + np));
      mma_pair<Element>(c[2 * np], c[2 * np + 1], a, b);
    }
  }
}

// Stores a warp's [kRowTiles*16 x 8 * kTiles] C tile, rounded to Element, at (row0, col0) of a
// swizzled [rows x kPitch] tile, where warp_gemm_sab and warp_gemm_atb read it back as an operand.
// The swizzle makes these 32-bit stores conflict free: the 8 rows g hit 8 different chunks.
template <int kPitch, typename Element, int kRowTiles, int kTiles>
__device__ __forceinline__ void store_c_tile(Element* tile, const float (&c)[kRowTiles][kTiles][4], int row0, int col0) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(
            &tile[swizzle_offset(row0 + mi * kMmaRows + g + half * 8, col0 + j * kMmaCols + 2 * t, kPitch)]) =
            pack2<Element>(c[mi][j][2 * half], c[mi][j][2 * half + 1]);
}

// store_c_tile with sm_90's stmatrix: one instruction stores the two n8 tiles of a 16-column pair
// (four 8x8 matrices, in the kRowsFirst order of an A fragment) instead of four 32-bit stores.
// tile is the shared address of the [rows x kPitch] tile; row0 % 8 == 0, col0 % 16 == 0.
template <int kPitch, typename Element, int kRowTiles, int kTiles>
__device__ __forceinline__ void store_c_tile_stsm(Element* tile_ptr, uint32_t tile, LdsmLane lane,
                                                  const float (&c)[kRowTiles][kTiles][4], int row0, int col0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static_assert(kTiles % 2 == 0, "whole 16-column pairs");
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int np = 0; np < kTiles / 2; ++np) {
      const float(&lo)[4] = c[mi][2 * np];
      const float(&hi)[4] = c[mi][2 * np + 1];
      const uint32_t packed[4] = {pack2<Element>(lo[0], lo[1]), pack2<Element>(lo[2], lo[3]),
                                  pack2<Element>(hi[0], hi[1]), pack2<Element>(hi[2], hi[3])};
      ptx::stmatrix_x4(
          ldsm_addr<kPitch, Element>(tile, lane.rows_first, row0 + mi * kMmaRows, col0 / (2 * kMmaCols) + np), packed);
    }
#else
  store_c_tile<kPitch>(tile_ptr, c, row0, col0);
#endif
}

// c[kRowTiles*16 x kN] += A * B with A [rows a_row0.., 0..kK) stored [m][k] and B stored [k][n],
// starting at column 16 * pair0: warp_gemm_rab for an A that other warps computed.
template <int kRowTiles, int kN, int kK, int kPitchA, int kPitchB, typename Element, bool kStagedB = false>
__device__ __forceinline__ void warp_gemm_sab(float (&c)[kRowTiles][kN / kMmaCols][4], uint32_t tile_a, LdsmLane lane_a,
                                              int a_row0, uint32_t tile_b, LdsmLane lane_b, int pair0) {
  warp_gemm_shared_ab<BStorage::kKN, kRowTiles, kN, kK, kPitchA, kPitchB, Element, kStagedB>(c, tile_a, lane_a, a_row0,
                                                                                             tile_b, lane_b, pair0);
}

// One k16 step of warp_gemm_atb's A (A's transpose stored [k][m], columns from 16 * a_pair0):
// the fragments of the kRowTiles row tiles.
template <int kRowTiles, int kPitchA, typename Element>
__device__ __forceinline__ void load_at_step(uint32_t (&a)[kRowTiles][4], uint32_t tile_a, LdsmLane lane_a, int kb,
                                             int a_pair0) {
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
    ptx::ldmatrix_x4_trans(a[mi], ldsm_addr<kPitchA, Element>(tile_a, lane_a.cols_first, kb * kMmaK, a_pair0 + mi));
}

// c += A * B over k16 step kb, A's fragments in registers, B stored [k][n] (columns from
// 16 * b_pair0): every B fragment feeds kRowTiles MMAs.
template <int kRowTiles, int kN, int kPitchB, typename Element>
__device__ __forceinline__ void mma_step_kn(float (&c)[kRowTiles][kN / kMmaCols][4], const uint32_t (&a)[kRowTiles][4],
                                            uint32_t tile_b, LdsmLane lane_b, int kb, int b_pair0) {
#pragma unroll
  for (int np = 0; np < kN / (2 * kMmaCols); ++np) {
    uint32_t b[4];
    ptx::ldmatrix_x4_trans(b, ldsm_addr<kPitchB, Element>(tile_b, lane_b.rows_first, kb * kMmaK, b_pair0 + np));
#pragma unroll
    for (int mi = 0; mi < kRowTiles; ++mi) mma_pair<Element>(c[mi][2 * np], c[mi][2 * np + 1], a[mi], b);
  }
}

template <int kRowTiles, int kTiles>
__device__ __forceinline__ void zero_c(float (&c)[kRowTiles][kTiles][4]) {
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kTiles; ++j) c[mi][j][0] = c[mi][j][1] = c[mi][j][2] = c[mi][j][3] = 0.f;
}

// c[kRowTiles*16 x kN] = A * B with A's transpose stored [k][m] (columns from 16 * a_pair0) and B
// stored [k][n] (columns from 16 * b_pair0), k over [0, kK).
template <int kRowTiles, int kN, int kK, int kPitchA, int kPitchB, typename Element>
__device__ __forceinline__ void warp_gemm_atb(float (&c)[kRowTiles][kN / kMmaCols][4], uint32_t tile_a, LdsmLane lane_a,
                                              int a_pair0, uint32_t tile_b, LdsmLane lane_b, int b_pair0) {
  zero_c(c);
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) {
    uint32_t a[kRowTiles][4];
    load_at_step<kRowTiles, kPitchA, Element>(a, tile_a, lane_a, kb, a_pair0);
    mma_step_kn<kRowTiles, kN, kPitchB, Element>(c, a, tile_b, lane_b, kb, b_pair0);
  }
}

// warp_gemm_atb's A for every k16 step, read once to be kept in registers over several column
// passes (warp_gemm_rtb).
template <int kRowTiles, int kK, int kPitchA, typename Element>
__device__ __forceinline__ void load_at_fragments(uint32_t (&a)[kK / kMmaK][kRowTiles][4], uint32_t tile_a,
                                                  LdsmLane lane_a, int a_pair0) {
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) load_at_step<kRowTiles, kPitchA, Element>(a[kb], tile_a, lane_a, kb, a_pair0);
}

// warp_gemm_atb with A already in registers (load_at_fragments): only B comes from shared memory.
template <int kRowTiles, int kN, int kK, int kPitchB, typename Element>
__device__ __forceinline__ void warp_gemm_rtb(float (&c)[kRowTiles][kN / kMmaCols][4],
                                              const uint32_t (&a)[kK / kMmaK][kRowTiles][4], uint32_t tile_b,
                                              LdsmLane lane_b, int b_pair0) {
  zero_c(c);
#pragma unroll
  for (int kb = 0; kb < kK / kMmaK; ++kb) mma_step_kn<kRowTiles, kN, kPitchB, Element>(c, a[kb], tile_b, lane_b, kb, b_pair0);
}

}  // namespace fusedattn::cuda::sm80
