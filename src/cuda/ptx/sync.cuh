// Intra-block synchronisation beyond __syncthreads: named barriers (a subset of warps meets on a
// barrier id with a thread count) and elect.sync (pick one lane of a converged warp).
#pragma once

#include <cstdint>

namespace fusedattn::cuda::ptx {

// bar.sync id, count; any SM. Waits until `count` threads (a multiple of 32) have arrived on
// barrier `id`, counting this warp. Id 0 is the one __syncthreads uses.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive id, count; any SM. Counts this warp towards barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// mov.u32 %tid.x; any SM. Volatile on purpose: values derived from it are recomputed where they
// are used instead of being hoisted out of a loop, which matters when dozens of them (per-lane
// shared-memory offsets) would otherwise stay live across a register-bound loop and spill.
__device__ __forceinline__ int thread_index_here() {
  uint32_t tid;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  return static_cast<int>(tid);
}

// elect.sync _|p, 0xffffffff; PTX ISA 8.0, sm_90. True in exactly one lane of the full warp;
// CUDA 13.0's <cuda/ptx> predates a wrapper for it.
__device__ __forceinline__ bool elect_one_sync() {
  uint32_t elected = 0;
  asm volatile(
      "{\n.reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(elected));
  return elected != 0;
}

}  // namespace fusedattn::cuda::ptx
