// Shared-memory transaction barriers (mbarrier) as the Hopper pipelines use them, over CCCL's
// <cuda/ptx> wrappers (which carry the PTX and SM requirement of each instruction).
//
// Contract: an mbarrier completes a phase when its pending-arrival count reaches zero AND the
// transaction bytes announced with expect_tx have all landed (TMA loads count them down). Waiters
// name the phase by parity: wait(bar, parity) returns once the phase with that parity completed.
// A freshly initialised barrier is in phase 0, so wait(bar, 1) returns at once -- the producer's
// first pass over "empty" barriers relies on that.
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace fusedattn::cuda::ptx {

// mbarrier.init.shared.b64 [addr], count; PTX ISA 7.0, sm_80.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  ::cuda::ptx::mbarrier_init(bar, arrivals);
}

// fence.mbarrier_init.release.cluster; PTX ISA 8.0, sm_90. Makes initialised barriers visible to
// the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
}

// mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [addr], tx; PTX ISA 8.0, sm_90.
// One arrival plus `bytes` of transactions the coming TMA copies will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared,
                                         bar, bytes);
}

// mbarrier.arrive.shared.b64 _, [addr]; PTX ISA 7.0, sm_80.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { (void)::cuda::ptx::mbarrier_arrive(bar); }

// mbarrier.arrive.shared::cta.b64 _, [addr], count; PTX ISA 7.8, sm_90: `count` arrivals at once
// (one thread standing for a group whose completion it has seen).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar, uint32_t count) {
  (void)::cuda::ptx::mbarrier_arrive(bar, count);
}

// mbarrier.try_wait.parity.shared::cta.b64 p, [addr], parity; PTX ISA 7.8, sm_90, in a loop
// (try_wait already suspends the thread for a while before reporting "not yet").
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

}  // namespace fusedattn::cuda::ptx
