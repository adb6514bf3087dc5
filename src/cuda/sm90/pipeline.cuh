// The rings' phase bookkeeping: PipelineState (the forward's rings, carried from block to block,
// run-time depth) and RingUse (the backward's, computed from the use count, compile-time depth)
// are the only places that know how a stage index wraps and when the barrier parity flips.
// Producer: acquire(empty) -> expect_tx -> TMA. Consumer: wait(full) -> wgmma -> release(empty).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

// The ring's run-time depth (<= the compiled count, for ablation runs) is passed to each advance()
// rather than carried: read from the kernel parameters where it is used, it holds no register
// across the consumers' register-bound loop. For the same reason stage and phase share one word
// (the consumers carry two of these, the K/V and the Q ring, through the tile loop; at 160
// registers per thread a second word each spilled).
class PipelineState {
 public:
  __device__ __forceinline__ int stage() const { return static_cast<int>(bits_ & ~kPhaseBit); }
  // Parity of the barrier phase this pass over the ring waits for.
  __device__ __forceinline__ uint32_t phase() const { return bits_ >> kPhaseShift; }

  // The stage before this one (the last block's, once the ring has moved past it).
  __device__ __forceinline__ int previous_stage(int depth) const { return stage() == 0 ? depth - 1 : stage() - 1; }

  __device__ __forceinline__ void advance(int depth) {
    ++bits_;
    if (stage() == depth) bits_ = (bits_ & kPhaseBit) ^ kPhaseBit;  // stage 0, phase flipped
  }

 private:
  static constexpr int kPhaseShift = 31;
  static constexpr uint32_t kPhaseBit = 1u << kPhaseShift;
  uint32_t bits_ = 0;
};

// Use `it` (0, 1, ...) of a ring of kDepth buffers, each with a full and an empty barrier: its
// buffer, and the parity of the phase its full barrier completes (the empty barrier's wait takes
// the other: a buffer starts empty). The backward's rings (bwd_kernel.cuh, bwd_producer.cuh) step by
// this alone.
template <int kDepth>
struct RingUse {
  int slot;
  uint32_t full_parity;
  __device__ __forceinline__ explicit RingUse(int it) : slot(it % kDepth), full_parity(it / kDepth & 1) {}
  __device__ __forceinline__ uint32_t empty_parity() const { return full_parity ^ 1; }
};

// A place in the K and V rings (the producer's or a consumer's). Where the V ring is deeper than
// the K ring (KernelConfig::kVStages) each ring has its own PipelineState; elsewhere one word
// serves both, so the register-bound tiles carry nothing more.
template <class Cfg>
class KVRingState {
 public:
  __device__ __forceinline__ const PipelineState& k() const { return k_; }
  __device__ __forceinline__ const PipelineState& v() const {
    if constexpr (kSplit) return v_;
    else return k_;
  }
  // On to the next KV block.
  __device__ __forceinline__ void advance(const Features& f) {
    k_.advance(f.num_stages);
    if constexpr (kSplit) v_.advance(f.num_v_stages);
  }

 private:
  static constexpr bool kSplit = Cfg::kVStages != Cfg::kStages;
  struct SameAsK {};
  PipelineState k_;
  [[no_unique_address]] std::conditional_t<kSplit, PipelineState, SameAsK> v_;
};

// Depth of the Q ring: the Q buffers in use. With one compiled buffer (d256) a compile-time 1,
// since a run-time depth there cost 28 B more spills.
template <class Cfg>
__device__ __forceinline__ int q_ring_depth(const Features& f) {
  static_assert(Cfg::kQBuffers <= 2, "TileRing takes a Q buffer from the tile count's low bit");
  return Cfg::kQBuffers > 1 ? f.q_buffers : 1;
}

// Whether O is staged in the tile's last KV stage (KernelConfig::kStagesOInKV, switched on).
template <class Cfg>
__device__ __forceinline__ bool stages_o_in_kv(const Features& f) {
  return Cfg::kStagesOInKV && f.o_in_kv;
}

// A CTA's tiles (work items) in order take the Q slots in turn (a ring of q_ring_depth) and the
// announcement slots in turn (a ring of kAnnouncementSlots, tile_announcement.cuh). One count
// gives both rings' place and barrier parity: the consumers carry it through the tile loop, where
// a word per ring would take one more of their registers.
class TileRing {
 public:
  static_assert(kAnnouncementSlots == 2, "slot and parity below are the count's low two bits");
  // The Q buffer of the current tile and the parity of its barriers' phase, in a ring of `depth`
  // (1 or 2) buffers.
  __device__ __forceinline__ int q_buffer(int depth) const { return depth > 1 ? static_cast<int>(count_ & 1) : 0; }
  __device__ __forceinline__ uint32_t q_phase(int depth) const { return depth > 1 ? count_ >> 1 & 1 : count_ & 1; }
  // With KernelConfig::kWarpgroupQ: warpgroup 0's Q slot (0 and 1 in turn) or warpgroup 1's (2),
  // and the parity of that slot's barriers' phase.
  __device__ __forceinline__ int warpgroup_q_slot(int warpgroup) const {
    return warpgroup == 0 ? static_cast<int>(count_ & 1) : 2;
  }
  __device__ __forceinline__ uint32_t warpgroup_q_phase(int warpgroup) const {
    return warpgroup == 0 ? count_ >> 1 & 1 : count_ & 1;
  }
  __device__ __forceinline__ int announcement_slot() const { return static_cast<int>(count_ & 1); }
  __device__ __forceinline__ uint32_t announcement_phase() const { return count_ >> 1 & 1; }
  __device__ __forceinline__ void advance() { ++count_; }
  __device__ __forceinline__ uint32_t tiles() const { return count_; }  // before the current one
  __device__ __forceinline__ TileRing following() const {
    TileRing next = *this;
    next.advance();
    return next;
  }

 private:
  uint32_t count_ = 0;  // tiles before the current one; 2^32 is a multiple of every period above
};

// Where warpgroup `warpgroup` finds its Q rows of the tile at `ring`: the slot (SharedStorage::q)
// and the parity of its barriers.
struct QSlot {
  int index;
  uint32_t phase;
};
template <class Cfg>
__device__ __forceinline__ QSlot q_slot(const TileRing& ring, int warpgroup, const Features& f) {
  if constexpr (Cfg::kWarpgroupQ) {
    return {ring.warpgroup_q_slot(warpgroup), ring.warpgroup_q_phase(warpgroup)};
  } else {
    const int depth = q_ring_depth<Cfg>(f);
    return {ring.q_buffer(depth), ring.q_phase(depth)};
  }
}
// The first row of warpgroup `warpgroup`'s Q (and O staging) in its slot: a whole tile's slot
// holds every warpgroup's rows, a warpgroup's slot only its own.
template <class Cfg>
__device__ __forceinline__ int q_slot_first_row(int warpgroup) {
  return Cfg::kWarpgroupQ ? 0 : warpgroup * kWarpgroupRows;
}

// Whether warpgroup `warpgroup` stages its O in the tile's last KV stage (stages_o_in_kv) rather
// than in its Q slot: with kWarpgroupQ warpgroup 0 keeps its own slot.
template <class Cfg>
__device__ __forceinline__ bool stages_own_o_in_kv(const Features& f, int warpgroup) {
  return stages_o_in_kv<Cfg>(f) && !(Cfg::kWarpgroupQ && warpgroup == 0);
}

// Whether warpgroup `warpgroup`'s Q slot, holding its staged O, goes back only behind the next
// tile's first GEMM issue (the next tile's Q is in another slot) rather than once the store has
// read it.
template <class Cfg>
__device__ __forceinline__ bool defers_q_release(const Features& f, int warpgroup) {
  return Cfg::kWarpgroupQ ? warpgroup == 0 : q_ring_depth<Cfg>(f) > 1;
}

// Views the barrier arrays of SharedStorage. K and V of a stage are freed separately: K is done
// once S = Q K^T has completed, a whole softmax before P V finishes with V, so with the early K
// release the producer can refill K that much sooner.
template <class Storage>
struct KVPipeline {
  Storage& smem;

  // The producer's first pass finds fresh "empty" barriers in phase 0: waiting for parity 1
  // returns at once, so it can fill every stage before any consumer has released one.
  template <class Ring>
  __device__ __forceinline__ void producer_acquire_k(const Ring& r) const {
    ptx::mbarrier_wait(&smem.k_empty[r.k().stage()], r.k().phase() ^ 1);
  }
  template <class Ring>
  __device__ __forceinline__ void producer_acquire_v(const Ring& r) const {
    ptx::mbarrier_wait(&smem.v_empty[r.v().stage()], r.v().phase() ^ 1);
  }
  template <class Ring>
  __device__ __forceinline__ void consumer_wait_k(const Ring& r) const {
    ptx::mbarrier_wait(&smem.k_full[r.k().stage()], r.k().phase());
  }
  template <class Ring>
  __device__ __forceinline__ void consumer_wait_v(const Ring& r) const {
    ptx::mbarrier_wait(&smem.v_full[r.v().stage()], r.v().phase());
  }
  // One arrival per consumer warp (the empty barriers count Cfg::kConsumerWarps): each warp arrives
  // after its own wgmma.wait_group, so the buffer is free only once every warp's reads completed.
  // In a cluster each warp arrives on every CTA's barrier (the barriers count all of the cluster's
  // consumer warps): the peers' producers multicast into this CTA's stage as well.
  template <class Ring>
  __device__ __forceinline__ void consumer_release_k(const Ring& r, int lane) const {
    release(&smem.k_empty[r.k().stage()], lane);
  }
  template <class Ring>
  __device__ __forceinline__ void consumer_release_v(const Ring& r, int lane) const {
    release(&smem.v_empty[r.v().stage()], lane);
  }

 private:
  __device__ __forceinline__ static void release(uint64_t* empty, int lane) {
    if constexpr (Storage::kClusterCtas > 1) {
      // Lane r arrives on the barrier of the cluster's CTA r, this CTA's own among them: every
      // CTA's arrival in one instruction, where lane 0 alone would issue one after another.
      static_assert(Storage::kClusterCtas <= 32, "one lane per CTA of the cluster");
      if (lane < Storage::kClusterCtas) ptx::mbarrier_arrive_cluster(empty, static_cast<uint32_t>(lane));
    } else if (lane == 0) {
      ptx::mbarrier_arrive(empty);
    }
  }
};

// The Q ring's way back: a tile's Q buffer is also its O staging, and it returns to the producer
// (q_empty) only once O's TMA store has read it. Only the thread that issued the store can wait
// for that, so that thread keeps the buffer here until it releases it: at once with one Q buffer
// (the next tile's Q waits for it), behind the next tile's first GEMM issue with two (the next
// Q is already in the other buffer).
struct PendingStore {
  // Whether this thread's last O store may still be reading its buffer. A flag, not the buffer's
  // index (the caller knows which buffer: the tile's own with one Q buffer, the other one with
  // two), so it can live in a predicate rather than one of the consumers' scarce registers.
  bool held = false;

  template <class Storage>
  __device__ __forceinline__ void release(Storage& smem, int buffer) {
    // q_empty counts one arrival per consumer warp: the warpgroup's.
    release_with([&] { ptx::mbarrier_arrive(&smem.q_empty[buffer], kWarpsPerWarpgroup); });
  }

  // The same for an O staged in K/V stage `stage` (KernelConfig::kStagesOInKV): the producer
  // refills it once the warpgroup's store has read it. In a cluster every CTA's producer refills
  // it (multicast), so the store's reads are signed off to all of them.
  template <class Storage>
  __device__ __forceinline__ void release_staged_o(Storage& smem, int stage, int warpgroup) {
    release_with([&] { ptx::mbarrier_arrive_every_cta<Storage::kClusterCtas>(&smem.o_read[stage][warpgroup]); });
  }

 private:
  // Once the held store has read its staging, `arrive` gives it back.
  template <class Arrive>
  __device__ __forceinline__ void release_with(Arrive arrive) {
    if (!held) return;
    ptx::tma_store_wait_read();
    arrive();
    held = false;
  }
};

}  // namespace fusedattn::cuda::sm90
