// cp.async loads into the tiles the Hopper backward's wgmmas read (sm90/bwd_tile.h): a row-major
// [rows x head dim] operand becomes [slab][row][64] with the 128-byte swizzle, the layout a TMA
// box of 64 columns with CU_TENSOR_MAP_SWIZZLE_128B writes. The copies go through cp.async
// rather than TMA so that any row stride, a sequence's partial last block and the rows of a
// variable-length batch need no tensor map: rows past `rows_valid` and columns past `head_dim`
// are zero-filled.
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/sm90/bwd_tile.h"

namespace fusedattn::cuda::sm90 {

constexpr int kChunkElems = kSwizzleChunkElems;  // one 16-byte cp.async of 16-bit elements
constexpr int kChunksPerSlabRow = kBwdSlabElems / kChunkElems;

// Rows [0, kRows) of `src` (row stride `row_stride` elements) into the tile at shared address
// `smem`, by kThreads threads of which this is `thread`; each thread's chunk column is the same on
// every row it copies.
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ __forceinline__ void load_slabs_async(uint32_t smem, const Element* src, int64_t row_stride,
                                                 int64_t rows_valid, int head_dim, int thread) {
  constexpr int kRowChunks = kHeadDim / kChunkElems;
  constexpr int kChunks = kRows * kRowChunks;
  static_assert(kChunks % kThreads == 0 && kThreads % kRowChunks == 0, "whole rows per pass of the threads");
  const int chunk = thread % kRowChunks;
  const int slab = chunk / kChunksPerSlabRow, in_slab = chunk % kChunksPerSlabRow;
  const bool column_in = chunk * kChunkElems < head_dim;
  // A single loader warp (32 threads, a producer's few registers) keeps the loop rolled.
  constexpr int kUnroll = kThreads >= kBwdWarpgroupThreads ? kChunks / kThreads : 1;
#pragma unroll kUnroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int row = thread / kRowChunks + i * (kThreads / kRowChunks);
    const uint32_t dst = smem + static_cast<uint32_t>(slab * kRows * kBwdRowBytes + row * kBwdRowBytes +
                                                      swizzle_chunk(row, in_slab) * 16);
    const bool in = column_in && row < rows_valid;
    // Out-of-range chunks read nothing (src-size 0) but still name an in-bounds address.
    ptx::cp_async_16(dst, in ? src + row * row_stride + chunk * kChunkElems : src, in);
  }
}

// kRows floats of each of two fp32 rows (lse2 and delta of one query block): 16-byte copies by
// threads 0 .. 2 * kRows / 4 - 1 (this is `thread`). Both sources are 16-byte aligned (workspace
// rows start on kBwdRowPad-row boundaries, blocks on kRows-row ones).
template <int kRows>
__device__ __forceinline__ void load_row_floats_async(uint32_t smem_a, const float* src_a, uint32_t smem_b,
                                                      const float* src_b, int thread) {
  constexpr int kChunks = kRows / 4;
  const int i = thread;
  if (i < kChunks)
    ptx::cp_async_16(smem_a + i * 16, src_a + 4 * i, true);
  else if (i < 2 * kChunks)
    ptx::cp_async_16(smem_b + (i - kChunks) * 16, src_b + 4 * (i - kChunks), true);
}

}  // namespace fusedattn::cuda::sm90
