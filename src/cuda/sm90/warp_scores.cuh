// One warp's 16 rows of S = Q K^T recomputed with warp-level mma.sync, from the Q tile and a K
// stage in shared memory as the TMA stored them (128-byte swizzle, 64-column slabs). wgmma is
// issued by a whole warpgroup; this serves a warp that alone finds it needs its scores again
// (the sum-checked step over S, Consumer::kSumCheckInPlace), a rare path. The
// accumulator comes out in the wgmma layout (ptx/wgmma.cuh), which per 8-key chunk is the
// mma.m16n8k16 C layout (ptx/mma_sm80.cuh): chunk j is s[4j .. 4j + 3].
#pragma once

#include <cstdint>

#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mma_sm80.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace fusedattn::cuda::sm90 {

// s = Q[row0 .. row0 + 16) K^T for a K tile of kBlockN keys. q_tile / k_tile: shared addresses of
// the tiles (slabs of kBlockM / kBlockN rows of 128 bytes each, 1024-byte aligned, as every tile of
// SharedStorage is); row0: the warp's first row in the Q tile, a multiple of 16.
template <typename Element, int kHeadDim, int kBlockM, int kBlockN>
__device__ __forceinline__ void warp_scores(float (&s)[kBlockN / 2], uint32_t q_tile, uint32_t k_tile, int row0,
                                            int lane) {
  constexpr uint32_t kRowBytes = ptx::kSwizzleRowBytes;
  constexpr uint32_t kChunkBytes = 16;  // one 8x8 ldmatrix row of 16-bit elements
  constexpr int kSlabCols = kRowBytes / sizeof(Element);
  constexpr int kKStep = 16, kKStepsPerSlab = kSlabCols / kKStep, kChunksPerKStep = 2;
  constexpr int kKeysPerLoad = 16;  // one ldmatrix.x4 of K: two 8-key chunks x 16 k
  constexpr int kRowsPerAtom = 8;   // the 128-byte swizzle permutes a row's chunks by row % 8
  static_assert(kBlockN % kKeysPerLoad == 0 && kHeadDim % kKStep == 0);
  static_assert(kBlockM % kRowsPerAtom == 0 && kBlockN % kRowsPerAtom == 0, "slabs start on a swizzle atom");
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) s[i] = 0.f;
  // ldmatrix.x4: lanes 8m .. 8m + 7 address the rows of matrix m. A (16 rows x 16 k): matrices
  // (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15). B of two
  // 8-key chunks: (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
  // Every row a lane addresses is lane % 8 within its swizzle atom, so chunk c of it sits at
  // c ^ (lane % 8) in every slab and every 16-key group: one base per k-step, immediate offsets.
  const int matrix = lane / 8, row_in_matrix = lane % 8;
  const uint32_t swizzle = static_cast<uint32_t>(row_in_matrix);
  const uint32_t a_row = q_tile + (row0 + row_in_matrix + 8 * (matrix % 2)) * kRowBytes;
  const uint32_t b_row = k_tile + (row_in_matrix + 8 * (matrix / 2)) * kRowBytes;
  const uint32_t a_chunk = matrix / 2, b_chunk = matrix % 2;
  // The k-steps stay a loop: unrolled, their address arithmetic spilled registers of the whole
  // kernel in the 192-row d64 tile (48 B) and d256 (540 B), for a path that rarely runs.
#pragma unroll 1
  for (int kk = 0; kk < kHeadDim / kKStep; ++kk) {
    const uint32_t slab = kk / kKStepsPerSlab, chunk0 = kChunksPerKStep * (kk % kKStepsPerSlab);
    uint32_t a[4];
    ptx::ldmatrix_x4(a, a_row + slab * kBlockM * kRowBytes + ((chunk0 + a_chunk) ^ swizzle) * kChunkBytes);
    const uint32_t b_step = b_row + slab * kBlockN * kRowBytes + ((chunk0 + b_chunk) ^ swizzle) * kChunkBytes;
#pragma unroll
    for (int n = 0; n < kBlockN / kKeysPerLoad; ++n) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, b_step + n * kKeysPerLoad * kRowBytes);
      ptx::mma_m16n8k16_two_chunks<Element>(*reinterpret_cast<float(*)[8]>(&s[8 * n]), a, b);
    }
  }
}

}  // namespace fusedattn::cuda::sm90
