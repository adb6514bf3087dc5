// Moving [rows x head_dim] tiles of Q, K, V, O between global memory and swizzled shared memory.
//
// Thread mapping: a stored row has kSlots = pitch / 8 chunk slots (16 bytes each; pitch is a
// multiple of 64 elements, so kSlots is 8, 16 or 32 and divides the thread count). Thread t owns
// slot t % kSlots of rows t / kSlots + i * kRowStep. So a warp covers whole contiguous rows
// (coalesced global accesses, conflict-free shared accesses), and each thread keeps one column:
// a single 64-bit global pointer advanced by a stride, and shared addresses that are one of two
// bases plus an immediate. (An address per chunk would keep dozens of registers live across the
// mainloop.) Slots beyond the kernel's head dim (the padding of d96/d192 rows) are idle.
#pragma once

#include <cstdint>

#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/cp_async.cuh"

namespace fusedattn::cuda::sm80 {

// Rows of a block of kRows starting `remaining` rows before a sequence end that lie inside it.
template <int kRows>
__device__ __forceinline__ int rows_inside(int64_t remaining) {
  return remaining < kRows ? static_cast<int>(remaining) : kRows;
}

// The byte distances a tensor's tile loads step by: from one of a thread's rows to its next one
// and from one tile to the next. The launcher computes them and passes them as kernel parameters,
// so the mainloop's 64-bit address adds read them from the constant bank: computed in the kernel,
// ptxas keeps them in four registers per tensor across the loop.
struct TileSteps {
  int64_t row, tile;
};

template <typename Element, int kRows, int kHeadDim, int kPitch, int kThreads>
struct TileIo {
  static constexpr int kChunkElems = kSwizzleChunkElems;
  static constexpr int kSlots = kPitch / kChunkElems;
  static constexpr int kRowStep = kThreads / kSlots;
  static constexpr int kRowsPerThread = kRows / kRowStep;
  static constexpr int kElemBytes = sizeof(Element);
  static_assert(kThreads % kSlots == 0 && kRows % kRowStep == 0, "rows must divide evenly among threads");
  // Row r + i * kRowStep has (r + i * kRowStep) % 8 == (r % 8) ^ (i * kRowStep % 8) exactly when the
  // step's residue is 0 or 4 (adding 4 mod 8 flips bit 2), so the swizzle takes one of two forms.
  static_assert(kRowStep % kSwizzleRows == 0 || kRowStep % kSwizzleRows == kSwizzleRows / 2,
                "the row step must keep the swizzle to two forms");

  // This thread's slot: its first row, its column, and its shared offsets (bytes) for rows whose
  // step residue is 0 (even) and 4 (odd).
  struct Slot {
    int row, col;
    uint32_t smem_even, smem_odd;
    __device__ __forceinline__ explicit Slot(int tid) : row(tid / kSlots), col(tid % kSlots * kChunkElems) {
      const int chunk = col / kChunkElems, x = row % kSwizzleRows;
      smem_even = (row * kPitch + (chunk ^ x) * kChunkElems) * kElemBytes;
      smem_odd = (row * kPitch + (chunk ^ x ^ (kSwizzleRows / 2)) * kChunkElems) * kElemBytes;
    }
    // Byte offset in the tile of this thread's i-th row (i is a compile-time constant).
    __device__ __forceinline__ uint32_t smem(int i) const {
      const bool odd = (i * kRowStep) % kSwizzleRows != 0;
      return (odd ? smem_odd : smem_even) + i * kRowStep * kPitch * kElemBytes;
    }
    __device__ __forceinline__ bool active() const { return col < kHeadDim; }
  };

  // Starts the asynchronous copy of rows [0, valid_rows) and columns [0, valid_cols) of a tile whose
  // row 0 is at gmem (rows row_stride elements apart); the rest of the tile is zero-filled, so
  // rows past a sequence end contribute nothing finite or infinite (they are masked to -inf in S
  // and meet P = 0 in P*V) and columns past head_dim add 0 to every dot product.
  static __device__ __forceinline__ void load_async(uint32_t smem, const Element* gmem, int64_t row_stride,
                                                    int valid_rows, int valid_cols, int tid) {
    const Slot slot(tid);
    if (!slot.active()) return;
    const Element* src = gmem + slot.row * row_stride + slot.col;
    const int64_t step = kRowStep * row_stride;
    const bool col_inside = slot.col < valid_cols;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool inside = col_inside && slot.row + i * kRowStep < valid_rows;
      ptx::cp_async_16(smem + slot.smem(i), inside ? src + i * step : gmem, inside);
    }
  }

  // TileSteps of a tensor whose rows are row_stride elements apart.
  static __host__ __device__ TileSteps steps(int64_t row_stride) {
    return {kRowStep * row_stride * kElemBytes, kRows * row_stride * kElemBytes};
  }

  // One thread's share of loading the tiles of a tensor that lie kRows rows apart (the KV blocks
  // of a sequence). Every tile but the last lies wholly inside the sequence: its copies need no
  // row predicates, so a copy's source is the thread's chunk pointer plus multiples of the steps,
  // one 64-bit add per row instead of a predicated pointer select and an index-to-address
  // conversion. Only the last tile (load_async) pays for them.
  struct TileSource {
    const unsigned char* chunk;  // this thread's chunk in its first row of tile 0
    int64_t row_stride;
    TileSteps steps;  // steps(row_stride): kernel parameters
    bool col_inside;  // false for a chunk past valid_cols: zero-filled every time

    __device__ __forceinline__ TileSource(const Element* gmem, int64_t row_stride_, TileSteps steps_, int valid_cols,
                                          int tid)
        : row_stride(row_stride_), steps(steps_) {
      const Slot slot(tid);
      col_inside = slot.col < valid_cols;
      // A zero-filled chunk reads nothing, but its source still stays inside the row.
      chunk = reinterpret_cast<const unsigned char*>(gmem + slot.row * row_stride + (col_inside ? slot.col : 0));
    }

    // This thread's chunk in its first row of tile `tile` (tiles are visited with tile >= 0).
    __device__ __forceinline__ const unsigned char* first_row(int tile) const {
      return chunk + static_cast<uint32_t>(tile) * steps.tile;
    }

    // The same in a paged tensor (FwdParams::block_table), whose tiles lie in pages page_bytes
    // apart: tile `tile_in_page` of page `page`.
    __device__ __forceinline__ const unsigned char* paged_first_row(int64_t page, int64_t page_bytes,
                                                                    int tile_in_page) const {
      return chunk + page * page_bytes + static_cast<uint32_t>(tile_in_page) * steps.tile;
    }

    // Starts the asynchronous copy of the tile whose first row (this thread's chunk in it) is at
    // src (first_row or paged_first_row), all of whose rows lie inside the sequence.
    __device__ __forceinline__ void load_whole_async(uint32_t smem, const unsigned char* src, int tid) const {
      const Slot slot(tid);
      if (!slot.active()) return;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) ptx::cp_async_16(smem + slot.smem(i), src + i * steps.row, col_inside);
    }

    // Starts the asynchronous copy of rows [0, valid_rows) (valid_rows >= 1) of the tile at src
    // (as in load_whole_async); the rows past them are zero-filled (see the static load_async),
    // their copies pointed at row 0.
    __device__ __forceinline__ void load_async(uint32_t smem, const unsigned char* src, int valid_rows, int tid) const {
      const Slot slot(tid);
      if (!slot.active()) return;
      const unsigned char* row0 = src - slot.row * row_stride * kElemBytes;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const bool inside = col_inside && slot.row + i * kRowStep < valid_rows;
        ptx::cp_async_16(smem + slot.smem(i), inside ? src + i * steps.row : row0, inside);
      }
    }
  };

  // Flips the sign of the chunks this thread loaded (after its cp.async completed). Used to fold a
  // negative softmax scale into Q so the softmax can always track the maximum of raw scores.
  static __device__ __forceinline__ void negate_own_chunks(unsigned char* smem, int tid) {
    constexpr uint32_t kSignBits = 0x80008000u;  // sign bit of both 16-bit halves
    const Slot slot(tid);
    if (!slot.active()) return;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      uint4* p = reinterpret_cast<uint4*>(smem + slot.smem(i));
      uint4 x = *p;
      x.x ^= kSignBits, x.y ^= kSignBits, x.z ^= kSignBits, x.w ^= kSignBits;
      *p = x;
    }
  }

  // Writes rows [0, valid_rows) and columns [0, valid_cols) of a shared tile to global memory with
  // 16-byte stores.
  static __device__ __forceinline__ void store(Element* gmem, int64_t row_stride, const unsigned char* smem,
                                               int valid_rows, int valid_cols, int tid) {
    const Slot slot(tid);
    if (!slot.active() || slot.col >= valid_cols) return;
    Element* dst = gmem + slot.row * row_stride + slot.col;
    const int64_t step = kRowStep * row_stride;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
      if (slot.row + i * kRowStep < valid_rows)
        *reinterpret_cast<uint4*>(dst + i * step) = *reinterpret_cast<const uint4*>(smem + slot.smem(i));
  }
};

}  // namespace fusedattn::cuda::sm80
