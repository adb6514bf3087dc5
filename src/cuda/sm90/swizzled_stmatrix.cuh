// A warp's 16 rows of a wgmma accumulator (fp32, the layout of ptx/wgmma.cuh) stored as 16-bit
// elements into a tile of 128B-swizzled 64-column slabs, the layout the TMA loads and stores: the
// forward's O staging (epilogue.cuh) and the backward's dK/dV staging (bwd_kernel.cuh).
//
// stmatrix.x4 (ptx/stmatrix.cuh) stores two neighbouring 16-byte chunks of the warp's 16 rows as
// four 8x8 matrices, in the order of a thread's accumulator quads: values 8i .. 8i + 7 are {rows
// 0-7, chunk 2i}, {rows 8-15, chunk 2i}, {rows 0-7, chunk 2i + 1}, {rows 8-15, chunk 2i + 1}, so
// lane l gives the address of row l % 8 of matrix l / 8. In a slab chunk c of row r sits at
// c ^ (r % 8) (common/swizzle.cuh); with 2i even that is (2i % 8) ^ (matrix / 2 ^ r % 8), the
// second term a lane's own for every i.
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/stmatrix.cuh"

namespace fusedattn::cuda::sm90 {

template <typename Element>
struct SwizzledStmatrix {
  static_assert(sizeof(Element) == 2, "stmatrix stores 16-bit elements");
  static constexpr int kChunkBytes = kSwizzleChunkElems * static_cast<int>(sizeof(Element));
  static constexpr int kChunksPerSlab = kSwizzlePitchMultiple / kSwizzleChunkElems;
  static constexpr int kMatricesPerStore = 4;
  static constexpr int kValuesPerStore = 2 * kMatricesPerStore;  // a pair of values per matrix
  // A thread's accumulator columns are 8j + 2 (lane % 4) + {0, 1}: each 8-column group one chunk.
  static_assert(kSwizzleChunkElems == 8 && kChunkBytes == 16, "an accumulator's 8-column group is one 16-byte chunk");

  // Lane lane's row: the warp's first (on a swizzle atom) plus its row among the warp's 16, and
  // its chunks' swizzle term.
  template <typename Int>
  __device__ __forceinline__ static Int row(Int warp_first_row, Int lane) {
    return warp_first_row + lane % kSwizzleRows + lane / kSwizzleRows % 2 * kSwizzleRows;
  }
  __device__ __forceinline__ static uint32_t lane_chunk(uint32_t lane) {
    return lane / kSwizzleRows / 2 ^ lane % kSwizzleRows;
  }

  // A thread's kValues accumulator values (its two rows' columns from the first written, times
  // scale) into the tile: row_address is the shared address of the lane's row (row()) in the
  // first slab written, chunk_term its lane_chunk(), slab_elems the distance between slabs.
  template <int kValues>
  __device__ __forceinline__ static void store(uint32_t row_address, uint32_t chunk_term, int slab_elems,
                                               const float (&acc)[kValues], float scale = 1.f) {
    static_assert(kValues % kValuesPerStore == 0, "whole chunk pairs");
#pragma unroll
    for (int i = 0; i < kValues / kValuesPerStore; ++i) {
      const int first_chunk = 2 * i;
      const uint32_t slab = static_cast<uint32_t>(first_chunk / kChunksPerSlab);
      const uint32_t position = static_cast<uint32_t>(first_chunk % kChunksPerSlab) ^ chunk_term;
      const int v = kValuesPerStore * i;
      const uint32_t regs[kMatricesPerStore] = {
          pack2<Element>(acc[v] * scale, acc[v + 1] * scale), pack2<Element>(acc[v + 2] * scale, acc[v + 3] * scale),
          pack2<Element>(acc[v + 4] * scale, acc[v + 5] * scale), pack2<Element>(acc[v + 6] * scale, acc[v + 7] * scale)};
      ptx::stmatrix_x4(row_address + (slab * slab_elems + position * kSwizzleChunkElems) * sizeof(Element), regs);
    }
  }
};

}  // namespace fusedattn::cuda::sm90
