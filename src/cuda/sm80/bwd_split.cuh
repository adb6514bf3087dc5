// Device side of the backward's tail split (bwd_split.h): the parts of a split item sum their
// dK and dV in an fp32 slot of the workspace, and the last part to finish takes the sums.
//
// A slot holds the accumulators in the C-fragment order of the threads that own them: float4 f
// of thread t (fragment f = key tile x output tile, its four values) sits at f * kThreads + t.
// Every part of an item runs the same kernel, so a thread adds and reads back exactly the
// elements it owns, and a warp's 16-byte adds cover 512 contiguous bytes (whole L2 lines).
#pragma once

#include <cstdint>

#include "cuda/ptx/red.cuh"
#include "cuda/sm80/bwd_tile.h"

namespace fusedattn::cuda::sm80 {

// Floats of one item's slot: dK and dV of the CTA's block_n x (instance head dim) tile.
template <typename T>
constexpr int64_t bwd_split_slot_floats() {
  return int64_t{2} * T::kKeyTiles * (T::kWarpOutDim / kMmaCols) * 4 * T::kThreads;
}

// The float4 of fragment `fragment` (key tile x output tile) of this thread in the dK half of a
// slot; the dV half follows kFragments x kThreads float4 later.
template <int kThreads>
__device__ __forceinline__ float4* split_slot_fragment(float* slot, int fragment, int thread) {
  return reinterpret_cast<float4*>(slot) + fragment * kThreads + thread;
}

// Adds this part's unscaled dK/dV accumulators into `slot` and counts the part in `count`.
// Returns true in the part that finished last, which then stores the item's dK/dV from the slot
// (load_split_sums); the other parts have nothing left to do.
template <int kThreads, int kKeyTiles, int kOutTiles>
__device__ __forceinline__ bool add_split_part(const float (&acc_dk)[kKeyTiles][kOutTiles][4],
                                               const float (&acc_dv)[kKeyTiles][kOutTiles][4], float* slot,
                                               int32_t* count, int parts) {
  constexpr int kFragments = kKeyTiles * kOutTiles;
  const int thread = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int mi = 0; mi < kKeyTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kOutTiles; ++j) {
      const int f = mi * kOutTiles + j;
      const float* dk = acc_dk[mi][j];
      const float* dv = acc_dv[mi][j];
      ptx::red_add_f32x4(reinterpret_cast<float*>(split_slot_fragment<kThreads>(slot, f, thread)),
                         make_float4(dk[0], dk[1], dk[2], dk[3]));
      ptx::red_add_f32x4(reinterpret_cast<float*>(split_slot_fragment<kThreads>(slot, f + kFragments, thread)),
                         make_float4(dv[0], dv[1], dv[2], dv[3]));
    }
  // Every thread's adds are visible device-wide before the CTA's ticket is taken, so the part that
  // draws the last ticket reads complete sums.
  __threadfence();
  __syncthreads();
  int last = 0;
  if (thread == 0) last = atomicAdd(count, 1) == parts - 1;
  if (!__syncthreads_or(last)) return false;
  __threadfence();
  return true;
}

// The item's summed fragments of key tile `mi`, dK (kDv false) or dV, in the accumulators' layout.
// Read into fresh registers rather than back into the accumulators: merging two definitions of
// the accumulators after the main loop changed its register allocation and made ptxas spill.
template <int kThreads, int kKeyTiles, int kOutTiles, bool kDv>
__device__ __forceinline__ void load_split_sums(float (&sums)[kOutTiles][4], float* slot, int mi) {
  constexpr int kFragments = kKeyTiles * kOutTiles;
  const int thread = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int j = 0; j < kOutTiles; ++j) {
    // L2 reads: the other parts' adds were performed there, not in this SM's L1.
    const float4 v = __ldcg(split_slot_fragment<kThreads>(slot, (kDv ? kFragments : 0) + mi * kOutTiles + j, thread));
    sums[j][0] = v.x, sums[j][1] = v.y, sums[j][2] = v.z, sums[j][3] = v.w;
  }
}

}  // namespace fusedattn::cuda::sm80
