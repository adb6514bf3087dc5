// A slice with at most 8 rows in use (a decode step: a packed GQA group's query heads at one
// position, or one query of a few heads), its keys split over the warpgroup's four warps, by
// warp-level MMAs. The warpgroup's wgmma computes all 64 rows of its slice however few are in
// use: a d128 step of 128 keys issues 16 m64n128k16 (1,024 tensor cycles) for at most 8 rows,
// the whole of it on the critical path. Here each warp takes a quarter of every KV block: S = Q K^T
// and O += P V of its keys by mma.m16n8k16 on the slice's first 16 rows (the second 8 held at 0),
// with its own online softmax over its keys. After the last block the four partial (max, sum, O)
// merge into warp 0 through the slice's Q rows past the 8 in use, which no warp reads.
//
// Operands are read as the TMA stored them (128-byte swizzle, 64-column slabs; warp_scores.cuh
// reads them the same way). Accumulators come out in the wgmma layout (ptx/wgmma.cuh), which per
// 8-column chunk is the mma.m16n8k16 C layout (ptx/mma_sm80.cuh): chunk j is acc[4j .. 4j + 3], so
// OnlineSoftmax, the epilogue and the split's part writes take S and O as they take the wgmma's.
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/softmax.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mma_sm80.cuh"
#include "cuda/ptx/mufu.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg>
struct WarpSplit {
  static constexpr int kHeadDim = Cfg::kHeadDim, kBlockN = Cfg::kBlockN;
  static constexpr int kKeys = kBlockN / kWarpsPerWarpgroup;  // a warp's keys of each block
  static constexpr int kMmaRows = 16;                         // mma.m16n8k16's M: the slice's first 16 rows
  static constexpr int kRowsInUse = kMmaRows / 2;             // the first 8; rows 8-15 are held at 0
  static constexpr int kKStep = 16;                           // mma.m16n8k16's K
  static constexpr int kSAcc = kMmaRows * kKeys / 32;         // S floats per thread
  static constexpr int kPRegs = kSAcc / 2;                    // P as packed pairs (the A operand of P V)
  static constexpr int kOAcc = kMmaRows * kHeadDim / 32;      // O floats per thread: the wgmma O's count
  static constexpr int kQSteps = kHeadDim / kKStep;           // k-steps of Q K^T
  static constexpr int kQRegs = 2 * kQSteps;                  // A's rows 0-7 per k-step: a[0] and a[2]
  static constexpr uint32_t kRowBytes = kSwizzleBytes;
  static constexpr uint32_t kChunkBytes = 16;  // an ldmatrix row: 8 elements of 16 bits
  static constexpr int kChunksPerKStep = kKStep * static_cast<int>(sizeof(Element)) / kChunkBytes;
  static constexpr int kKStepsPerSlab = Cfg::kSlabCols / kKStep;
  static constexpr int kRowsPerAtom = 8;  // the 128-byte swizzle permutes a row's chunks by row % 8
  static_assert(kKeys % kKStep == 0, "a warp's keys are whole k-steps of P V");
  static_assert(kHeadDim % kKStep == 0);
  static_assert(kOAcc == kWarpgroupRows * kHeadDim / kWarpgroupThreads, "O is the wgmma accumulator's registers");

  // The lane, re-read where an operand's addresses are formed (ptx::value_here), so they are
  // computed per block rather than hoisted out of the tile loop, where the prefill loop's
  // registers would have to hold them (hoisted, they spilled 200 B at d128).
  __device__ __forceinline__ static uint32_t lane_here(int lane) { return ptx::value_here(static_cast<uint32_t>(lane)); }

  // The 16-byte chunk at column chunk `chunk` of a swizzled row r (r % 8 = swizzle): the TMA's
  // 128-byte swizzle XORs the chunk index with the row's place in its 8-row atom.
  __device__ __forceinline__ static uint32_t chunk_offset(uint32_t chunk, uint32_t swizzle) {
    return (chunk ^ swizzle) * kChunkBytes;
  }

  // The A operand's rows 0-7 of every k-step of Q (a[0], a[2] of mma.m16n8k16: ldmatrix.x2 of
  // (rows 0-7, k 0-7) and (rows 0-7, k 8-15)), from the slice's first row of the Q slot. Loaded
  // once a tile: Q is the same for every block.
  __device__ __forceinline__ static void load_q(uint32_t (&q)[kQRegs], uint32_t q_slot, int first_row, int lane) {
    // ldmatrix.x2 reads the addresses of lanes 0-15; the others repeat them. first_row is a
    // multiple of 64, so a lane's row sits at lane % 8 in its swizzle atom.
    const uint32_t l = lane_here(lane), row = l % kRowsPerAtom, matrix = l / 8 % 2;
    const uint32_t row_address = q_slot + (first_row + row) * kRowBytes;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      const uint32_t slab = kk / kKStepsPerSlab, chunk = kChunksPerKStep * (kk % kKStepsPerSlab) + matrix;
      uint32_t rows[2];
      ptx::ldmatrix_x2(rows, row_address + slab * Cfg::kQSlotRows * kRowBytes + chunk_offset(chunk, row));
      q[2 * kk] = rows[0];
      q[2 * kk + 1] = rows[1];
    }
  }

  // s = Q[rows 0-16) K[key0 .. key0 + kKeys)^T from the K stage k_tile (kBlockN rows a slab).
  // B of two 8-key chunks per ldmatrix.x4: (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15,
  // k 0-7), (keys 8-15, k 8-15). The k-steps go outermost, so the kKeys / 8 accumulator chains
  // interleave.
  __device__ __forceinline__ static void scores(float (&s)[kSAcc], const uint32_t (&q)[kQRegs], uint32_t k_tile,
                                                int key0, int lane) {
#pragma unroll
    for (int i = 0; i < kSAcc; ++i) s[i] = 0.f;
    const uint32_t l = lane_here(lane), row = l % kRowsPerAtom, matrix = l / 8;
    const uint32_t key_address = k_tile + (key0 + row + kRowsPerAtom * (matrix / 2)) * kRowBytes;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      const uint32_t a[4] = {q[2 * kk], 0u, q[2 * kk + 1], 0u};
      const uint32_t slab = kk / kKStepsPerSlab, chunk = kChunksPerKStep * (kk % kKStepsPerSlab) + matrix % 2;
      const uint32_t step_address = key_address + slab * kBlockN * kRowBytes + chunk_offset(chunk, row);
#pragma unroll
      for (int n = 0; n < kKeys / kKStep; ++n) {
        uint32_t b[4];
        ptx::ldmatrix_x4(b, step_address + n * kKStep * kRowBytes);
        ptx::mma_m16n8k16_two_chunks<Element>(*reinterpret_cast<float(*)[8]>(&s[8 * n]), a, b);
      }
    }
  }

  // The probabilities as P V's A operand: k-step kk takes S's chunks 2kk, 2kk + 1; the second
  // rows' pairs (odd indices, rows 8-15) are 0, so O's rows 8-15 stay 0.
  __device__ __forceinline__ static void convert_p(const float (&s)[kSAcc], uint32_t (&p)[kPRegs]) {
#pragma unroll
    for (int i = 0; i < kPRegs; ++i) p[i] = i % 2 == 0 ? pack2<Element>(s[2 * i], s[2 * i + 1]) : 0u;
  }

  // O (rows 0-16 x kHeadDim) += P (16 x kKeys) V[key0 .. key0 + kKeys) from the V stage v_tile,
  // stored [key][column]: B by ldmatrix.x4.trans of (keys 0-7, columns 0-7), (keys 8-15, columns
  // 0-7), (keys 0-7, columns 8-15), (keys 8-15, columns 8-15), two 8-column chunks of O.
  __device__ __forceinline__ static void accumulate_pv(float (&o)[kOAcc], const uint32_t (&p)[kPRegs], uint32_t v_tile,
                                                       int key0, int lane) {
    const uint32_t l = lane_here(lane), row = l % kRowsPerAtom, matrix = l / 8;
    const uint32_t key_address = v_tile + (key0 + row + kRowsPerAtom * (matrix % 2)) * kRowBytes;
#pragma unroll
    for (int kk = 0; kk < kKeys / kKStep; ++kk) {
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
#pragma unroll
      for (int c = 0; c < kHeadDim / kKStep; ++c) {
        const uint32_t slab = c / kKStepsPerSlab, chunk = kChunksPerKStep * (c % kKStepsPerSlab) + matrix / 2;
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, key_address + kk * kKStep * kRowBytes + slab * kBlockN * kRowBytes +
                                      chunk_offset(chunk, row));
        ptx::mma_m16n8k16_two_chunks<Element>(*reinterpret_cast<float(*)[8]>(&o[8 * c]), a, b);
      }
    }
  }

  // The merge's scratch: the slice's Q rows from kRowsInUse on, which load_q never reads, in each
  // slab of the Q slot. Unit j < kHeadDim / 8 holds O's chunk j of the three other warps' first
  // rows (o[4j], o[4j + 1]), unit kHeadDim / 8 their (max, quad-reduced sum): warp w > 0 at
  // 256 (w - 1) bytes into the unit, lane l's float2 at 8 l (each warp's store is conflict-free).
  // A unit's place depends on j alone, known at compile time, and the thread's offset in it on
  // nothing that changes, so no address is worked out at run time but the one.
  static constexpr uint32_t kWarpBytes = 32 * sizeof(float2);
  static constexpr int kOthers = kWarpsPerWarpgroup - 1;
  static constexpr uint32_t kUnitBytes = kOthers * kWarpBytes;
  static constexpr int kUnits = kHeadDim / 8 + 1;
  static constexpr int kUnitsPerSlab = (kWarpgroupRows - kRowsInUse) * kRowBytes / kUnitBytes;
  static_assert(kUnits <= kUnitsPerSlab * Cfg::kSlabs, "the merge's scratch fits in the slice's Q rows past those in use");
  static constexpr uint32_t unit_offset(int unit) {
    return unit / kUnitsPerSlab * Cfg::kQSlotRows * kRowBytes + unit % kUnitsPerSlab * kUnitBytes;
  }

  // Merges the four warps' partial rows into warp 0's o and softmax (the others' become empty rows:
  // O 0, no keys): with M the largest of the warps' maxima, O = sum_w 2^(m_w - M) O_w and the same
  // for the sums. A warp that saw no key (max kNoKeyMax, sum and O 0) adds nothing. `barrier`: a
  // named barrier of the warpgroup's 128 threads. The caller's next barrier (the epilogue's first)
  // keeps the others from overwriting the scratch before warp 0 has read it.
  __device__ __forceinline__ static void merge_warps(float (&o)[kOAcc], OnlineSoftmax& softmax, uint32_t q_slot,
                                                     int first_row, int warp, int lane, uint32_t barrier) {
    const float sum = quad_sum(softmax.row_sum[0]);
    const uint32_t scratch = q_slot + (first_row + kRowsInUse) * kRowBytes + lane_here(lane) * sizeof(float2);
    if (warp > 0) {
      const uint32_t mine = scratch + (warp - 1) * kWarpBytes;
#pragma unroll
      for (int j = 0; j < kUnits - 1; ++j) ptx::st_shared_v2_f32(mine + unit_offset(j), o[4 * j], o[4 * j + 1]);
      ptx::st_shared_v2_f32(mine + unit_offset(kUnits - 1), softmax.row_max[0], sum);
    }
    ptx::named_barrier_sync(barrier, kWarpgroupThreads);
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < kOAcc; ++i) o[i] = 0.f;
      softmax.reset();
      return;
    }
    float max_of[kOthers], sum_of[kOthers];
    float merged_max = softmax.row_max[0];
#pragma unroll
    for (int w = 0; w < kOthers; ++w) {
      ptx::ld_shared_v2_f32(scratch + w * kWarpBytes + unit_offset(kUnits - 1), max_of[w], sum_of[w]);
      merged_max = fmaxf(merged_max, max_of[w]);
    }
    // Each max is finite (kNoKeyMax for a warp that saw no key), so each difference is <= 0 and
    // never NaN: its factor is in [0, 1].
    const float own = ptx::ex2_approx(softmax.row_max[0] - merged_max);
    float factor[kOthers];
    float merged_sum = sum * own;
#pragma unroll
    for (int w = 0; w < kOthers; ++w) {
      factor[w] = ptx::ex2_approx(max_of[w] - merged_max);
      merged_sum = fmaf(sum_of[w], factor[w], merged_sum);
    }
#pragma unroll
    for (int j = 0; j < kUnits - 1; ++j) {
      float x = o[4 * j] * own, y = o[4 * j + 1] * own;
#pragma unroll
      for (int w = 0; w < kOthers; ++w) {
        float2 theirs;
        ptx::ld_shared_v2_f32(scratch + w * kWarpBytes + unit_offset(j), theirs.x, theirs.y);
        x = fmaf(theirs.x, factor[w], x);
        y = fmaf(theirs.y, factor[w], y);
      }
      o[4 * j] = x;
      o[4 * j + 1] = y;
    }
    softmax.row_max[0] = merged_max;
    // finalize() sums the quad's partial sums: the merged sum once.
    softmax.row_sum[0] = lane % 4 == 0 ? merged_sum : 0.f;
  }
};

}  // namespace fusedattn::cuda::sm90
