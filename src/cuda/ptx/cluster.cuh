// Thread-block clusters (sm_90): a CTA's rank in its cluster, the cluster-wide barrier, and
// arrivals on a peer CTA's mbarrier through distributed shared memory.
//
// Contract: a CTA may touch a peer's shared memory (an arrival, a multicast TMA load) only
// between two cluster_sync() calls that every thread of both CTAs makes: the first after the
// peer's barriers are initialised, the last before either CTA exits.
#pragma once

#include <cuda/ptx>
#include <cstdint>

#include "cuda/ptx/mbarrier.cuh"

namespace fusedattn::cuda::ptx {

// mov.u32 r, %cluster_ctarank; PTX ISA 7.8, sm_90.
__device__ __forceinline__ uint32_t cluster_ctarank() { return ::cuda::ptx::get_sreg_cluster_ctarank(); }

// barrier.cluster.arrive.release + barrier.cluster.wait.acquire; PTX ISA 8.0, sm_90. Every
// thread of the cluster meets here; what each wrote before (barrier initialisation included) is
// visible to all after.
__device__ __forceinline__ void cluster_sync() {
  ::cuda::ptx::barrier_cluster_arrive(::cuda::ptx::sem_release);
  ::cuda::ptx::barrier_cluster_wait();
}

// mapa.shared::cluster.u32 + mbarrier.arrive.shared::cluster.b64; PTX ISA 8.0, sm_90. One arrival
// on the mbarrier at the same offset as `bar` in the shared memory of the cluster's CTA `rank`,
// with the default (CTA-scope release) semantics: it tells the peer that this thread's reads of
// a buffer have completed, and publishes no writes the peer reads. With .release.cluster the
// paired d128 forward ran 33% slower than the unpaired one (H200, full 2k-16k); with the default
// form, even (docs/hopper.md, session 35).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// st.async.shared::cluster.mbarrier::complete_tx::bytes.b32; PTX ISA 8.1, sm_90. `value` into the
// word at `word`'s offset in the shared memory of the cluster's CTA `rank`, which completes
// sizeof(int) bytes of the current phase's transaction on the mbarrier at `bar`'s offset there:
// the peer that waits on that barrier (after its own arrive.expect_tx) then reads the word.
__device__ __forceinline__ void store_to_cta(int* word, int value, uint64_t* bar, uint32_t rank) {
  ::cuda::ptx::st_async(static_cast<int*>(__cluster_map_shared_rank(word, rank)), value,
                        static_cast<uint64_t*>(__cluster_map_shared_rank(bar, rank)));
}

// One arrival on the mbarrier at `bar`'s offset in every CTA of a cluster of kCtas (this one's
// included), from one thread; kCtas = 1: a plain local arrival.
template <int kCtas>
__device__ __forceinline__ void mbarrier_arrive_every_cta(uint64_t* bar) {
  if constexpr (kCtas == 1) {
    mbarrier_arrive(bar);
  } else {
#pragma unroll
    for (uint32_t rank = 0; rank < kCtas; ++rank) mbarrier_arrive_cluster(bar, rank);
  }
}

}  // namespace fusedattn::cuda::ptx
