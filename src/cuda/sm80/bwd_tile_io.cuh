// Global <-> shared/register traffic of the sm80 backward kernel: cp.async tile loads (zero-filled
// outside the sequence and beyond p.head_dim), the dK/dV epilogue, and the dQ hand-off into the
// fp32 workspace through a staged shared tile (atomics, or ordered adds in deterministic mode).
#pragma once

#include <cuda/atomic>

#include <cstdint>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/common/int_math.h"
#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/red.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/sm80/bwd_shared.cuh"

namespace fusedattn::cuda::sm80 {

constexpr int kElemsPerChunk = ptx::kCpAsyncBytes / 2;  // 16-bit elements per 16-byte copy

// Copies rows [row0, row0 + kRows) of a [row, dim] operand (row stride `row_stride`, first element
// `base`) into a swizzled [kRows x pitch] tile. Rows >= valid_rows and chunks past head_dim are
// zero-filled, so they contribute nothing to any product.
// A thread copies the same column chunk of rows r0, r0 + kRowsPerStep, ...: one running source
// pointer, and destinations a constant apart (kRowsPerStep is a multiple of the swizzle period).
// Per-step 64-bit row offsets were loop-invariant values the compiler kept live across the whole
// main loop: they made the backward spill. Where the thread count is no multiple of the row's
// chunks (d96), thread i copies chunks i, i + kThreads, ... of the tile in row order (walking the
// padded 128-element rows instead measured 10% slower) -- unless every row gets a whole number of
// threads that each take every kLanes-th chunk of it (d96, d192): then a thread's chunks share
// one source row pointer and one row test, and their destinations are one address XOR a
// compile-time chunk step plus whole 128-byte groups. That XOR goes onto the full shared address
// (`smem` is on a swizzle-group boundary, BwdShared), which changes with the Q/dO stage every
// iteration: no per-step swizzled offsets stay loop-invariant for ptxas to hoist and spill.
// The rows left in the sequence are clamped to kRows once, so the per-copy row tests are 32-bit.
template <int kRows, int kHeadDim, int kPitch, int kThreads, typename Element>
__device__ __forceinline__ void load_tile_async(uint32_t smem, const Element* base, int64_t row_stride, int64_t row0,
                                                int64_t valid_rows, int head_dim) {
  constexpr int kChunksPerRow = kHeadDim / kElemsPerChunk;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
  constexpr int kRowsPerStep = kThreads / kChunksPerRow;
  const int rows_left = static_cast<int>(valid_rows - row0 < kRows ? valid_rows - row0 : kRows);
  if constexpr (kThreads % kChunksPerRow == 0 && kRowsPerStep % kSwizzleRows == 0 && kRows % kRowsPerStep == 0) {
    const int r0 = threadIdx.x / kChunksPerRow, c = threadIdx.x % kChunksPerRow;
    const bool col_in = c * kElemsPerChunk < head_dim;
    const Element* src = base + (row0 + r0) * row_stride + c * kElemsPerChunk;
    const uint32_t dst = smem + swizzle_offset(r0, c * kElemsPerChunk, kPitch) * sizeof(Element);
#pragma unroll
    for (int step = 0; step < kRows / kRowsPerStep; ++step) {
      const bool in = col_in && r0 + step * kRowsPerStep < rows_left;
      ptx::cp_async_16(dst + step * kRowsPerStep * kPitch * sizeof(Element), in ? src : base, in);
      src += kRowsPerStep * row_stride;
    }
  } else if constexpr (kThreads % kRows == 0 && kChunksPerRow % (kThreads / kRows) == 0 &&
                       kSwizzleRows % (kThreads / kRows) == 0) {
    constexpr int kLanes = kThreads / kRows;  // threads per row
    const int r = threadIdx.x / kLanes, q = threadIdx.x % kLanes;
    const bool row_in = r < rows_left;
    const Element* src = base + (row0 + r) * row_stride + q * kElemsPerChunk;
    // Chunk q + kLanes * step keeps q in its low bits (kLanes divides the swizzle period), so its
    // swizzled place is chunk q's with the step's bits flipped inside the group, plus whole groups.
    const uint32_t lane_dst = smem + swizzle_offset(r, q * kElemsPerChunk, kPitch) * sizeof(Element);
#pragma unroll
    for (int step = 0; step < kChunksPerRow / kLanes; ++step) {
      const int chunk_in_group = step * kLanes % kSwizzleRows, group = step * kLanes / kSwizzleRows;
      const bool in = row_in && (q + step * kLanes) * kElemsPerChunk < head_dim;
      const uint32_t dst = (lane_dst ^ static_cast<uint32_t>(chunk_in_group * ptx::kCpAsyncBytes)) +
                           static_cast<uint32_t>(group * kSwizzleRows * ptx::kCpAsyncBytes);
      ptx::cp_async_16(dst, in ? src + step * kLanes * kElemsPerChunk : base, in);
    }
  } else {
#pragma unroll
    for (int step = 0; step < kChunks / kThreads; ++step) {
      const int idx = step * kThreads + threadIdx.x;
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
      const bool in = r < rows_left && c * kElemsPerChunk < head_dim;
      const Element* src = in ? base + (row0 + r) * row_stride + c * kElemsPerChunk : base;
      ptx::cp_async_16(smem + swizzle_offset(r, c * kElemsPerChunk, kPitch) * sizeof(Element), src, in);
    }
  }
}

// Copies kCount floats (16-byte aligned, always in bounds: the workspace is padded) to shared.
template <int kCount, int kThreads>
__device__ __forceinline__ void load_floats_async(float* smem, const float* src, int thread) {
  constexpr int kFloatsPerChunk = ptx::kCpAsyncBytes / sizeof(float);
  for (int idx = thread; idx < kCount / kFloatsPerChunk; idx += kThreads)
    ptx::cp_async_16(ptx::smem_addr(smem + idx * kFloatsPerChunk), src + idx * kFloatsPerChunk, true);
}

// Copies kCount floats to shared as pair quads: floats 2q, 2q + 1 of the source land at
// 4q..4q + 3 as (x, y, x, y), the C-fragment order of an mma tile whose columns they belong to
// (rows g and g + 8 share the column values). 4-byte cp.async (.ca: .cg copies only 16 bytes).
template <int kCount, int kThreads>
__device__ __forceinline__ void load_float_quads_async(float* smem, const float* src, int thread) {
  constexpr int kQuadFloats = 4, kDstFloats = 2 * kCount;
  static_assert(kThreads % kQuadFloats == 0 && (kDstFloats % kThreads == 0 || kDstFloats < kThreads),
                "whole quads per thread step");
  // Destination float thread + i * kThreads copies source float (thread / 4) * 2 + thread % 2 +
  // i * kThreads / 2: one base pointer per thread, constant steps.
  const float* from = src + thread / kQuadFloats * 2 + thread % 2;
  const uint32_t to = ptx::smem_addr(smem + thread);
  if (kDstFloats < kThreads && thread >= kDstFloats) return;
#pragma unroll
  for (int i = 0; i < ceil_div(kDstFloats, kThreads); ++i) {
    const uint32_t dst = to + static_cast<uint32_t>(i * kThreads * sizeof(float));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(from + i * kThreads / 2) : "memory");
  }
}

// Element pointer of (row 0 of sequence b, head h) in a [.., row, head, dim] operand.
template <typename Element>
__device__ __forceinline__ const Element* operand_base(const void* data, const OperandStrides& s, int b,
                                                       int64_t first_row, int h) {
  return static_cast<const Element*>(data) + static_cast<int64_t>(b) * s.batch + first_row * s.row +
         static_cast<int64_t>(h) * s.head;
}

// Writes a warp's [kRowTiles*16 x kColTiles*8] fp32 C tile to rows row0.. and columns col0.. of a
// [row, dim] Element operand whose row 0 is `base`, skipping rows >= valid_rows and columns >=
// head_dim (a multiple of 8, so a column pair is wholly inside or outside): 4-byte stores
// straight from the fragments, where staging them for store_tile is not taken.
template <typename Element, int kRowTiles, int kColTiles>
__device__ __forceinline__ void store_c_rows(Element* base, int64_t row_stride, const float (&c)[kRowTiles][kColTiles][4],
                                             int row0, int col0, int valid_rows, int head_dim) {
  const int lane = threadIdx.x % kWarpSize, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mi * kMmaRows + g + half * 8;
      if (row >= valid_rows) continue;
#pragma unroll
      for (int j = 0; j < kColTiles; ++j) {
        const int col = col0 + j * kMmaCols + 2 * t;
        if (col < head_dim)
          *reinterpret_cast<uint32_t*>(base + row * row_stride + col) = pack2<Element>(c[mi][j][2 * half], c[mi][j][2 * half + 1]);
      }
    }
}

// Stores rows [0, valid_rows) and columns [0, head_dim) of a swizzled [kRows x kPitch] shared
// tile (load_tile_async's layout) to a [row, dim] operand whose row 0 is `base`, with 16-byte
// stores: the dK/dV epilogue stages its fragments in the dead K/V tiles first, so every global
// store is a whole chunk of a contiguous row instead of 4 scattered bytes (a warp's 4-byte
// fragment stores covered 8 rows per instruction). Thread i takes chunks i, i + kThreads, ... in
// row order; a whole warp stores 512 contiguous bytes of a row or whole rows. The thread index is
// read again here: taken from the kernel's, it stayed live across the main loop and ptxas spilled
// 4 bytes in the d192 window instance's sm_80 SASS.
template <int kRows, int kHeadDim, int kPitch, int kThreads, typename Element>
__device__ __forceinline__ void store_tile(Element* base, int64_t row_stride, const Element* smem, int valid_rows,
                                           int head_dim) {
  constexpr int kChunksPerRow = kHeadDim / kElemsPerChunk;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "every thread stores the same number of chunks");
  const int thread = ptx::thread_index_here();
  if constexpr (kThreads % kChunksPerRow == 0) {
    // Whole rows per step (all but d192): a thread keeps its column and one running pointer.
    constexpr int kRowsPerStep = kThreads / kChunksPerRow;
    const int r0 = thread / kChunksPerRow, c = thread % kChunksPerRow * kElemsPerChunk;
    if (c >= head_dim) return;
    Element* dst = base + r0 * row_stride + c;
#pragma unroll
    for (int step = 0; step < kRows / kRowsPerStep; ++step) {
      const int r = r0 + step * kRowsPerStep;
      if (r < valid_rows)
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(smem + swizzle_offset(r, c, kPitch));
      dst += kRowsPerStep * row_stride;
    }
  } else {
#pragma unroll
    for (int step = 0; step < kRows * kChunksPerRow / kThreads; ++step) {
      const int idx = step * kThreads + thread;
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow * kElemsPerChunk;
      if (r < valid_rows && c < head_dim)
        *reinterpret_cast<uint4*>(base + r * row_stride + c) =
            *reinterpret_cast<const uint4*>(smem + swizzle_offset(r, c, kPitch));
    }
  }
}

// The fp32 dQ tile of one iteration, [kRows x kCols] row-major in shared memory. Float pair
// (col / 2) of row r is stored at pair (col / 2) ^ (4 * (r % 4)): the warp's 64-bit fragment
// stores (rows g, pairs 4j + t) then spread each half-warp over all 32 banks, and a row segment
// of 32 floats read by one warp stays a permutation of itself (the XOR keeps an aligned group of
// 16 pairs), so both sides are conflict free.
constexpr int kDqStageSwizzleRows = 4;
constexpr int kDqStagePairStep = 4;  // pairs swapped per row step: 4 = one fragment row's t span
constexpr int kDqSegment = kWarpSize;  // floats per row segment of one add instruction (128 bytes)

template <int kCols>
__device__ __forceinline__ int dq_stage_offset(int row, int col) {
  static_assert(kCols % kDqSegment == 0, "rows are whole 32-float segments");
  return row * kCols + ((col / 2) ^ (row % kDqStageSwizzleRows * kDqStagePairStep)) * 2 + col % 2;
}

// Stores a warp's [kRowTiles*16 x kColTiles*8] mma C tile at (row0, col0) of the staged dQ tile.
// kLaneReadHere re-reads the thread index (a volatile move) so the per-lane swizzled offsets are
// worked out at each call: otherwise, with the dQ tile staged in several column passes, ptxas may
// keep one offset per (pass, column tile) live across the main loop and spill (bwd_kernel.cuh
// says where).
template <int kCols, bool kLaneReadHere, int kRowTiles, int kColTiles>
__device__ __forceinline__ void stage_dq_fragments(float* tile, const float (&dq)[kRowTiles][kColTiles][4], int row0,
                                                   int col0) {
  const int lane = kLaneReadHere ? ptx::thread_index_here() % kWarpSize : threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < kColTiles; ++j) {
        const int row = row0 + mi * kMmaRows + g + half * kMmaCols, col = col0 + j * kMmaCols + 2 * t;
        *reinterpret_cast<float2*>(tile + dq_stage_offset<kCols>(row, col)) =
            make_float2(dq[mi][j][2 * half], dq[mi][j][2 * half + 1]);
      }
}

// One element of the staged tile as this lane handles it in the global adds: warp w takes rows
// w, w + kWarps, ..., a row as 32-float segments, so the global access of each step is one
// contiguous 128-byte run. With kWarps a multiple of the swizzle period every row of a thread has
// the same XOR, so the shared offsets are one per-thread base plus constants. Rows >= valid_rows
// and columns >= head_dim are not `valid`.
struct StagedDq {
  bool valid;
  int64_t offset;  // floats from the (row 0, column 0) element of dq_acc
  float value;
};
template <int kCols, int kWarps>
__device__ __forceinline__ StagedDq staged_dq(const float* tile, int64_t pitch, int64_t row0, int64_t valid_rows,
                                              int head_dim, int i, int seg) {
  static_assert(kWarps % kDqStageSwizzleRows == 0, "every row of a warp has the same swizzle phase");
  const int r = i * kWarps + threadIdx.x / kWarpSize, c = seg * kDqSegment + threadIdx.x % kWarpSize;
  return {row0 + r < valid_rows && c < head_dim, (row0 + r) * pitch + c, tile[dq_stage_offset<kCols>(r, c)]};
}

// Adds the staged dQ tile into dq_acc rows [row0, row0 + kRows) (row pitch `pitch` floats) with
// fp32 atomics: every KV block of the sequence adds into the same rows, in whatever order the CTAs
// run. The caller has synchronised the CTA after staging.
// A tile wholly inside the rows and columns (all but the last query block and narrower head dims)
// takes one test instead of a branch around every add.
template <int kRows, int kCols, int kWarps>
__device__ __forceinline__ void atomic_add_dq(float* acc_base, int64_t pitch, int64_t row0, const float* tile,
                                              int64_t valid_rows, int head_dim) {
  static_assert(kRows % kWarps == 0, "warps take whole rows");
  auto add_all = [&](auto checked) {
#pragma unroll
    for (int i = 0; i < kRows / kWarps; ++i)
#pragma unroll
      for (int seg = 0; seg < kCols / kDqSegment; ++seg) {
        const StagedDq e = staged_dq<kCols, kWarps>(tile, pitch, row0, valid_rows, head_dim, i, seg);
        if (!decltype(checked)::value || e.valid) atomicAdd(acc_base + e.offset, e.value);
      }
  };
  if (row0 + kRows <= valid_rows && kCols <= head_dim)
    add_all(std::false_type{});
  else
    add_all(std::true_type{});
}

// Adds one warp's own [kRows x kCols] region (rows r0.., columns c0..) of the staged
// [.. x kTileCols] tile into dq_acc, with no CTA barrier: the warp staged that region itself, so
// a __syncwarp publishes it, and the other warps go on computing while these adds go out. Each
// lane adds kLaneFloats consecutive floats: four with the sm_90 vector reduction (one
// instruction covers 512 contiguous bytes of four rows), one otherwise (one 128-byte row
// segment per instruction). kCols is a multiple of the 32-float swizzle group, so the region's
// staged rows stay inside it and both the shared reads and the global adds are contiguous.
template <int kTileCols, int kRows, int kCols, bool kVector>
__device__ __forceinline__ void warp_add_dq(float* acc_base, int64_t pitch, int64_t row0, const float* tile, int r0,
                                            int c0, int64_t valid_rows, int head_dim) {
  constexpr int kLaneFloats = kVector ? 4 : 1;
  constexpr int kWarpFloats = kWarpSize * kLaneFloats;
  // A row narrower than a warp's step that does not divide it (d192's 96-column dQ warp tiles with
  // vector adds) takes one step per row, the lanes past the row idle.
  constexpr bool kRowSteps = kCols < kWarpFloats && kWarpFloats % kCols != 0;
  constexpr int kStepFloats = kRowSteps ? kCols : kWarpFloats;
  static_assert(kCols % kDqSegment == 0 && (kRows * kCols) % kStepFloats == 0, "whole warp steps over the region");
  static_assert(kStepFloats % kCols == 0 || kCols % kStepFloats == 0, "a step covers whole rows or part of one");
  // A step covers kStepRows whole rows, or 1 / kStepsPerRow of one row: either way the lane's
  // (row, column) of a step is its first step's plus constants, so one 64-bit global pointer per
  // lane serves every step (per-step 64-bit row offsets cost ~10 instructions per add).
  constexpr int kStepRows = kStepFloats >= kCols ? kStepFloats / kCols : 1;
  constexpr int kStepsPerRow = kStepFloats >= kCols ? 1 : kCols / kStepFloats;
  const int lane = threadIdx.x % kWarpSize;
  if (kRowSteps && lane * kLaneFloats >= kStepFloats) return;
  const int lane_r = r0 + lane * kLaneFloats / kCols, lane_c = c0 + lane * kLaneFloats % kCols;
  auto add_all = [&](auto checked) {
    // Unchecked, the head dim is the instance's, so the workspace pitch is kTileCols
    // (bwd_workspace_layout rounds head_dim up to a multiple of 8): at a compile-time pitch every
    // vector step's address is the lane's pointer plus an immediate, not another 64-bit add. The
    // scalar adds keep the runtime pitch: with 32 immediate addresses ptxas held more staged
    // values at once and spilled (sm_80 d128: 12 -> 36 bytes).
    const int64_t row_pitch = decltype(checked)::value || !kVector ? pitch : kTileCols;
    float* const lane_dst = acc_base + (row0 + lane_r) * row_pitch + lane_c;
    // Rows left in the sequence from the lane's first row, clamped into 32 bits (the region has
    // kRows rows).
    const int rows_left = static_cast<int>(valid_rows - row0 - lane_r < kRows ? valid_rows - row0 - lane_r : kRows);
#pragma unroll
    for (int step = 0; step < kRows * kCols / kStepFloats; ++step) {
      const int dr = step / kStepsPerRow * kStepRows, dc = step % kStepsPerRow * kStepFloats;
      // head_dim is a multiple of 8, so a 4-float group is wholly inside or outside it.
      if (decltype(checked)::value && (dr >= rows_left || lane_c + dc >= head_dim)) continue;
      float* dst = lane_dst + dr * row_pitch + dc;
      const float* src = tile + dq_stage_offset<kTileCols>(lane_r + dr, lane_c + dc);
      if constexpr (kVector)
        ptx::red_add_f32x4(dst, *reinterpret_cast<const float4*>(src));
      else
        atomicAdd(dst, *src);
    }
  };
  if (row0 + r0 + kRows <= valid_rows && head_dim == kTileCols)
    add_all(std::false_type{});
  else
    add_all(std::true_type{});
}

// Deterministic variant: KV blocks add into a query block strictly in increasing block order.
// The semaphore counts the blocks done; this CTA (the order-th contributor) waits for its turn,
// does a plain read-add-write through L2 (.cg: L1 is not coherent across SMs), then passes the
// turn on. Lower-numbered KV blocks are launched first (bwd_cta), so the wait always ends.
// The barrier after the wait also publishes the staged tile to every thread. The reads go out
// kDqOrderedBatch at a time before their writes: one L2 round trip per batch while the turn is
// held, instead of one per element (the compiler cannot tell the writes from the next reads).
constexpr int kDqOrderedBatch = 8;

template <int kRows, int kCols, int kWarps>
__device__ __forceinline__ void ordered_add_dq(float* acc_base, int64_t pitch, int64_t row0, const float* tile,
                                               int64_t valid_rows, int head_dim, int32_t* sem, int32_t order) {
  constexpr int kSegs = kCols / kDqSegment;
  constexpr int kBatchRows = kDqOrderedBatch / kSegs > 0 ? kDqOrderedBatch / kSegs : 1;
  static_assert(kRows % kWarps == 0 && kRows / kWarps % kBatchRows == 0, "warps take whole batches of rows");
  ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> turn(*sem);
  if (threadIdx.x == 0)
    while (turn.load(::cuda::memory_order_acquire) != order) {
    }
  __syncthreads();
#pragma unroll
  for (int i0 = 0; i0 < kRows / kWarps; i0 += kBatchRows) {
    float sum[kBatchRows][kSegs];
#pragma unroll
    for (int i = 0; i < kBatchRows; ++i)
#pragma unroll
      for (int seg = 0; seg < kSegs; ++seg) {
        const StagedDq e = staged_dq<kCols, kWarps>(tile, pitch, row0, valid_rows, head_dim, i0 + i, seg);
        if (e.valid) sum[i][seg] = __ldcg(acc_base + e.offset) + e.value;
      }
#pragma unroll
    for (int i = 0; i < kBatchRows; ++i)
#pragma unroll
      for (int seg = 0; seg < kSegs; ++seg) {
        const StagedDq e = staged_dq<kCols, kWarps>(tile, pitch, row0, valid_rows, head_dim, i0 + i, seg);
        if (e.valid) __stcg(acc_base + e.offset, sum[i][seg]);
      }
  }
  __threadfence();  // this thread's adds are visible device-wide before the turn is passed on
  __syncthreads();
  if (threadIdx.x == 0) turn.fetch_add(1, ::cuda::memory_order_release);
}

}  // namespace fusedattn::cuda::sm80
