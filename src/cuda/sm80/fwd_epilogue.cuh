// The end of the forward kernel: normalise O, stage it through shared memory (so global stores
// are whole 16-byte chunks of contiguous rows instead of 4-byte scattered fragments), store the
// rows inside the sequence and the columns inside head_dim, and write the LSE.
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/swizzle.cuh"
#include "cuda/sm80/fwd_kv_split.h"
#include "cuda/sm80/fwd_tile_io.cuh"

namespace fusedattn::cuda::sm80 {

// Writes this warp's normalised O fragments into the swizzled tile smem_o (rows of the warp start at
// warp_row0, a multiple of 8). Lane layout of the C fragment: row g = lane / 4 (+8), columns 2t,
// 2t+1, t = lane % 4. Every row a lane writes has row % 8 == g, so the swizzle turns the 16-byte
// chunk dt of a row into dt ^ g: one xor of the lane's offset per chunk within a 128-byte group
// (the tile is 128-byte aligned and g's bits sit in bits 4-6 of the offset), with the row, group
// and fragment offsets as constants of the stores. Unsigned, so no sign fix-ups of lane / 4.
template <typename Element, int kPitch, int kMTiles, int kDTiles>
__device__ __forceinline__ void stage_o(Element* smem_o, const float (&o)[kMTiles][kDTiles][4],
                                        const float (&inv_sum)[kMTiles][2], int warp_row0, int lane) {
  constexpr uint32_t kTileM = 16, kHalf = 8, kChunkBytes = kSwizzleChunkElems * sizeof(Element);
  constexpr uint32_t kRowBytes = kPitch * sizeof(Element), kGroupBytes = kSwizzleRows * kChunkBytes;
  const uint32_t g = static_cast<uint32_t>(lane) / 4, t = static_cast<uint32_t>(lane) % 4;
  const uint32_t lane_offset =
      (static_cast<uint32_t>(warp_row0) + g) * kRowBytes + g * kChunkBytes + t * 2 * sizeof(Element);
  unsigned char* tile = reinterpret_cast<unsigned char*>(smem_o);
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
    const uint32_t chunk = (lane_offset ^ (dt % kSwizzleRows) * kChunkBytes) + dt / kSwizzleRows * kGroupBytes;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t packed =
            pack2<Element>(o[mt][dt][2 * h] * inv_sum[mt][h], o[mt][dt][2 * h + 1] * inv_sum[mt][h]);
        *reinterpret_cast<uint32_t*>(tile + chunk + (mt * kTileM + h * kHalf) * kRowBytes) = packed;
      }
  }
}

// One quad lane (t == 0) per row writes the LSE of rows g and g + 8 of each m16 tile.
template <int kMTiles>
__device__ __forceinline__ void store_lse(float* lse_rows, int64_t row_stride, const float (&lse)[kMTiles][2],
                                          int warp_row0, int valid_rows, int lane) {
  constexpr int kTileM = 16, kHalf = 8;
  if (lse_rows == nullptr || lane % 4 != 0) return;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + mt * kTileM + h * kHalf + lane / 4;
      if (row < valid_rows) lse_rows[row * row_stride] = lse[mt][h];
    }
}

// A part of a split launch (fwd_kv_split.h): this warp's normalised fp32 O rows and their LSE to
// the workspace, the CTA's row r at slot first_slot + r; the combine kernel reads them back. The
// lanes of a quad write one row's 8-column groups as float2s (the C fragment's columns 2t, 2t+1).
template <int kMTiles, int kDTiles>
__device__ __forceinline__ void store_part(const KvSplit& split, int64_t first_slot,
                                           const float (&o)[kMTiles][kDTiles][4], const float (&inv_sum)[kMTiles][2],
                                           const float (&lse)[kMTiles][2], int warp_row0, int valid_rows, int lane) {
  constexpr int kTileM = 16, kHalf = 8, kTileN = 8;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + mt * kTileM + h * kHalf + g;
      if (row >= valid_rows) continue;
      float* dst = split.o + (first_slot + row) * split.o_cols + 2 * t;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        *reinterpret_cast<float2*>(dst + dt * kTileN) = {o[mt][dt][2 * h] * inv_sum[mt][h],
                                                        o[mt][dt][2 * h + 1] * inv_sum[mt][h]};
      if (t == 0) split.lse[first_slot + row] = lse[mt][h];
    }
}

}  // namespace fusedattn::cuda::sm80
