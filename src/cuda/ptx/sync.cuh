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

// mov.u32 %ctaid.{x,y,z} (volatile); any SM. The block index read again where it is used, for
// the same reason: a kernel's epilogue re-derives its coordinates from it after a register-bound
// loop instead of keeping the prologue's values (or pointers built from them) live across it.
__device__ __forceinline__ uint3 block_index_here() {
  uint3 block;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(block.x));
  asm volatile("mov.u32 %0, %%ctaid.y;\n" : "=r"(block.y));
  asm volatile("mov.u32 %0, %%ctaid.z;\n" : "=r"(block.z));
  return block;
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
