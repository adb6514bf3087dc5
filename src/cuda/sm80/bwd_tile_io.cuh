// Global <-> shared/register traffic of the sm80 backward kernel: cp.async tile loads (zero-filled
// outside the sequence and beyond p.head_dim), the dK/dV epilogue, and the dQ hand-off into the
// fp32 workspace (atomics, or ordered adds in deterministic mode).
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/sm80/bwd_shared.cuh"

namespace fusedattn::cuda::sm80 {

constexpr int kElemsPerChunk = ptx::kCpAsyncBytes / 2;  // 16-bit elements per 16-byte copy

// Copies rows [row0, row0 + kRows) of a [row, dim] operand (row stride `row_stride`, first element
// `base`) into a swizzled [kRows x pitch] tile. Rows >= valid_rows and chunks past head_dim are
// zero-filled, so they contribute nothing to any product.
template <int kRows, int kHeadDim, int kPitch, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const Element* base, int64_t row_stride, int64_t row0,
                                                int64_t valid_rows, int head_dim) {
  constexpr int kChunksPerRow = kHeadDim / kElemsPerChunk;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int step = 0; step < kChunks / kThreads; ++step) {
    const int idx = step * kThreads + threadIdx.x;
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
    const bool in = row0 + r < valid_rows && c * kElemsPerChunk < head_dim;
    const Element* src = in ? base + (row0 + r) * row_stride + c * kElemsPerChunk : base;
    ptx::cp_async_16(smem + swizzle_offset(r, c * kElemsPerChunk, kPitch) * sizeof(Element), src, in);
  }
}

// Copies kCount floats (16-byte aligned, always in bounds: the workspace is padded) to shared.
template <int kCount, int kThreads>
__device__ __forceinline__ void load_floats_async(float* smem, const float* src, int thread) {
  constexpr int kFloatsPerChunk = ptx::kCpAsyncBytes / sizeof(float);
  for (int idx = thread; idx < kCount / kFloatsPerChunk; idx += kThreads)
    ptx::cp_async_16(ptx::smem_addr(smem + idx * kFloatsPerChunk), src + idx * kFloatsPerChunk, true);
}

// Element pointer of (row 0 of sequence b, head h) in a [.., row, head, dim] operand.
template <typename Element>
__device__ __forceinline__ const Element* operand_base(const void* data, const OperandStrides& s, int b,
                                                       int64_t first_row, int h) {
  return static_cast<const Element*>(data) + static_cast<int64_t>(b) * s.batch + first_row * s.row +
         static_cast<int64_t>(h) * s.head;
}

// Writes a warp's [16 x kCols] fp32 accumulator (mma C layout) times `scale` to a [row, dim]
// Element operand, skipping rows >= valid_rows and columns >= head_dim (head_dim is a multiple of
// 8, so a column pair is either fully inside or fully outside).
template <typename Element, int kColTiles>
__device__ __forceinline__ void store_warp_rows(Element* base, int64_t row_stride, int64_t row0, int col0,
                                                const float (&acc)[kColTiles][4], float scale, int64_t valid_rows,
                                                int head_dim) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t row = row0 + g + half * 8;
    if (row >= valid_rows) continue;
#pragma unroll
    for (int j = 0; j < kColTiles; ++j) {
      const int col = col0 + j * 8 + 2 * t;
      if (col < head_dim)
        *reinterpret_cast<uint32_t*>(base + row * row_stride + col) =
            pack2<Element>(acc[j][2 * half] * scale, acc[j][2 * half + 1] * scale);
    }
  }
}

// Adds a warp's [kRowTiles*16 x kColTiles*8] dQ tile into dq_acc rows [row0, ...) (row pitch
// `pitch` floats) with fp32 atomics: every KV block of the sequence adds into the same rows, in
// whatever order the CTAs run.
template <int kRowTiles, int kColTiles>
__device__ __forceinline__ void atomic_add_dq(float* acc_base, int64_t pitch, int64_t row0, int col0,
                                              const float (&dq)[kRowTiles][kColTiles][4], int64_t valid_rows,
                                              int head_dim) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + mi * 16 + g + half * 8;
      if (row >= valid_rows) continue;
#pragma unroll
      for (int j = 0; j < kColTiles; ++j) {
        const int col = col0 + j * 8 + 2 * t;
        if (col >= head_dim) continue;
        float* dst = acc_base + row * pitch + col;
        atomicAdd(dst, dq[mi][j][2 * half]);
        atomicAdd(dst + 1, dq[mi][j][2 * half + 1]);
      }
    }
}

// Deterministic variant: KV blocks add into a query block strictly in increasing block order.
// The semaphore counts the blocks done; this CTA (the order-th contributor) waits for its turn,
// does a plain read-add-write through L2 (.cg: L1 is not coherent across SMs), then passes the
// turn on. Lower-numbered KV blocks are launched first (blockIdx.x), so the wait always ends.
template <int kRowTiles, int kColTiles>
__device__ __forceinline__ void ordered_add_dq(float* acc_base, int64_t pitch, int64_t row0, int col0,
                                               const float (&dq)[kRowTiles][kColTiles][4], int64_t valid_rows,
                                               int head_dim, int32_t* sem, int32_t order) {
  ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> turn(*sem);
  if (threadIdx.x == 0)
    while (turn.load(::cuda::memory_order_acquire) != order) {
    }
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t row = row0 + mi * 16 + g + half * 8;
      if (row >= valid_rows) continue;
#pragma unroll
      for (int j = 0; j < kColTiles; ++j) {
        const int col = col0 + j * 8 + 2 * t;
        if (col >= head_dim) continue;
        float2* dst = reinterpret_cast<float2*>(acc_base + row * pitch + col);
        float2 v = __ldcg(dst);
        v.x += dq[mi][j][2 * half];
        v.y += dq[mi][j][2 * half + 1];
        __stcg(dst, v);
      }
    }
  __threadfence();  // this thread's adds are visible device-wide before the turn is passed on
  __syncthreads();
  if (threadIdx.x == 0) turn.fetch_add(1, ::cuda::memory_order_release);
}

}  // namespace fusedattn::cuda::sm80
