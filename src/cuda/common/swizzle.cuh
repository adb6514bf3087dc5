// The XOR swizzle of every [rows x 64k-element] 16-bit tile the sm80 kernels keep in shared memory.
//
// A row is split into 16-byte chunks (8 elements). Stored naively with a 128-byte (or multiple)
// row pitch, chunk c of rows r .. r+7 would all sit in the same 4 banks, so an ldmatrix that reads
// one chunk from 8 consecutive rows (one 8x8 matrix) would be an 8-way bank conflict. Storing
// logical chunk c of row r at physical chunk c ^ (r % 8) (only the low 3 bits of c change, so the
// chunk stays inside its 128-byte group) spreads those 8 reads over all 32 banks. cp.async writes of
// whole rows remain conflict free because a row's 8 chunks are only permuted among themselves.
//
// The row pitch must be a multiple of 64 elements (128 bytes): tiles whose head dim is not (32, 96)
// are padded up to one, and the padding chunks are never loaded nor read.
#pragma once

#include <cstdint>

#include "cuda/common/int_math.h"

namespace fusedattn::cuda {

constexpr int kSwizzleChunkElems = 8;  // 16 bytes of a 16-bit element: one cp.async / ldmatrix row
constexpr int kSwizzleRows = 8;        // chunks are permuted within groups of 8 (128 bytes = 32 banks)
constexpr int kSwizzlePitchMultiple = kSwizzleChunkElems * kSwizzleRows;  // 64 elements

// Pitch (elements per stored row) of a tile holding `cols` logical columns.
constexpr __host__ __device__ int swizzle_pitch(int cols) {
  return round_up(cols, kSwizzlePitchMultiple);
}

// Physical chunk index of logical chunk `chunk` in row `row`.
constexpr __host__ __device__ int swizzle_chunk(int row, int chunk) { return chunk ^ (row % kSwizzleRows); }

// Element offset of logical (row, col) in a swizzled tile with the given pitch; col must be a
// multiple of kSwizzleChunkElems or lie inside one chunk (the in-chunk position is kept).
constexpr __host__ __device__ int swizzle_offset(int row, int col, int pitch) {
  return row * pitch + swizzle_chunk(row, col / kSwizzleChunkElems) * kSwizzleChunkElems + col % kSwizzleChunkElems;
}

// CPU-checkable property: for a fixed logical chunk, 8 consecutive rows map to 8 distinct 16-byte
// bank groups (conflict-free ldmatrix), and a row's chunks stay a permutation of themselves.
constexpr bool swizzle_is_conflict_free(int pitch) {
  if (pitch % kSwizzlePitchMultiple != 0) return false;
  const int chunks = pitch / kSwizzleChunkElems;
  for (int c = 0; c < chunks; ++c)
    for (int r0 = 0; r0 < 2 * kSwizzleRows; r0 += kSwizzleRows) {
      unsigned seen = 0;  // bank group = (byte offset / 16) % 8
      for (int r = r0; r < r0 + kSwizzleRows; ++r) {
        const int group = (swizzle_offset(r, c * kSwizzleChunkElems, pitch) / kSwizzleChunkElems) % kSwizzleRows;
        if (seen & (1u << group)) return false;
        seen |= 1u << group;
      }
    }
  for (int r = 0; r < kSwizzleRows; ++r) {
    unsigned long long seen = 0;
    for (int c = 0; c < chunks && c < 64; ++c) seen |= 1ull << swizzle_chunk(r, c);
    if (chunks <= 64 && seen != (chunks == 64 ? ~0ull : (1ull << chunks) - 1)) return false;
  }
  return true;
}

static_assert(swizzle_is_conflict_free(64) && swizzle_is_conflict_free(128) && swizzle_is_conflict_free(192) &&
                  swizzle_is_conflict_free(256),
              "the swizzle must be conflict free for every pitch the kernels use");

}  // namespace fusedattn::cuda
