// The producer warpgroup: one elected thread owns the tile schedule and issues every TMA load.
// Per work item (a tile, or a part of a split tile: its share of the KV blocks): the tile's
// announcement for the consumers (tile_announcement.cuh; it goes out as soon as its slot is
// free, ahead of everything else), its Q (into the next slot of the Q ring, once the O staged
// there has left; with KernelConfig::kWarpgroupQ each warpgroup's rows into their own slot), K
// and V of the first visible KV block (the highest, or the lowest: TileMask::kAscending), then K/V
// pairs for the remaining blocks, each stage acquired from the ring before it is overwritten.
// With one Q buffer the first K goes before Q, so it loads during the previous tile's epilogue.
// With two, this all runs while the consumers still work on the previous tile; with warpgroup Q
// slots warpgroup 0's rows go first (their slot is free a tile ahead) and warpgroup 1's after the
// first K. After the last tile it publishes kNoTile, which sends the consumers home.
#pragma once

#include <type_traits>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/tile_announcement.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/trace.cuh"

namespace fusedattn::cuda::sm90 {

// A K/V map's row and batch entry of key `key` of sequence `sequence` in paged K/V: its row in the
// page the sequence's table names. In 32 bits (keys and pages are TMA coordinates): a 64-bit
// division is a call in SASS, and with it in the producer ptxas re-allocated the d256 consumers'
// registers (436-720 B of spills in the 64-key full-mask kernel).
struct KVCoordinates {
  int row, batch;
};
__device__ __forceinline__ KVCoordinates paged_coordinates(const FwdParams& p, int sequence, int key) {
  const int page_size = static_cast<int>(p.page_size), column = key / page_size;
  return {key - column * page_size, static_cast<int>(table_page(p, sequence, column))};
}

template <typename Element, class Cfg, MaskKind kMask>
struct Producer {
  using Storage = SharedStorage<Element, Cfg>;
  static constexpr uint32_t kQSlotBytes = Storage::kQSlotElems * sizeof(Element);
  static constexpr uint32_t kKVBytes = Storage::kKVElems * sizeof(Element);
  static constexpr int kQSlabElems = Cfg::kQSlotRows * Cfg::kSlabCols;
  static constexpr int kKVSlabElems = Cfg::kBlockN * Cfg::kSlabCols;

  const KernelParams& params;
  Storage& smem;

  // With O staged in K/V stages (KernelConfig::kStagesOInKV): which stages hold an O whose TMA
  // store may still read it (bit s) and the parity each o_read barrier completes next (bit
  // kPhaseBits + 2 s + part). One word: the producer runs on 24 registers. A stage holds at most
  // one such O at a time (the next O staged in it needs the stage refilled first), so its two
  // barriers never run a phase ahead of these waits.
  struct StagedO {
    static constexpr int kPhaseBits = 8;
    static_assert(Cfg::kStages <= kPhaseBits);
    uint32_t bits = 0;
    __device__ __forceinline__ void mark(int stage) { bits |= 1u << stage; }
    // Before the stage's K (part 0) or V (part 1) is refilled: wait until that O has been read.
    __device__ __forceinline__ void wait_read(Storage& smem, int stage, int part) {
      if (Cfg::kWarpgroupQ && part == 0) return;  // warpgroup 0 stages its O in its Q slot
      if ((bits >> stage & 1) == 0) return;
      const int phase = kPhaseBits + 2 * stage + part;
      ptx::mbarrier_wait(&smem.o_read[stage][part], bits >> phase & 1);
      bits ^= 1u << phase;
      if (part == 1) bits &= ~(1u << stage);
    }
  };

  // Where KV block n of tile t starts in the K/V maps: row k_start + n * kBlockN of batch entry
  // kv_batch; with paged K/V (FwdParams::block_table) its row in the page that the sequence's
  // table names (a block lies in one page: runs_block64, kCudaPageRows).
  __device__ __forceinline__ KVCoordinates kv_coordinates(const WorkTile& t, int n, int kv_batch) const {
    const int key = n * Cfg::kBlockN;
    if (Cfg::kClusterCtas > 1 || params.p.block_table == nullptr) return {t.k_start + key, kv_batch};
    return paged_coordinates(params.p, t.batch, key);
  }

  // A [rows x kHeadDim] tile as kSlabs boxes of [rows x 64], each into its own swizzled slab.
  __device__ __forceinline__ void load_tile(const CUtensorMap* map, Element* dst, int slab_elems, int row, int head, int batch,
                            uint64_t* bar) const {
#pragma unroll
    for (int s = 0; s < Cfg::kSlabs; ++s)
      ptx::tma_load_4d(dst + s * slab_elems, map, s * Cfg::kSlabCols, row, head, batch, bar);
  }

  // In a cluster: this CTA's rows of a K/V block starting at `row` (its rank's kClusterBlockRows
  // of each slab), multicast into the same place in every CTA of the cluster.
  __device__ __forceinline__ void load_cluster_share(const CUtensorMap* map, Element* dst, int row, int head, int batch,
                                                     uint64_t* bar) const {
    constexpr uint16_t kEveryCta = (1u << Cfg::kClusterCtas) - 1;
    const int share = cluster_rank() * Cfg::kClusterBlockRows;
#pragma unroll
    for (int s = 0; s < Cfg::kSlabs; ++s)
      ptx::tma_load_4d_multicast(dst + s * kKVSlabElems + share * Cfg::kSlabCols, map, s * Cfg::kSlabCols, row + share,
                                 head, batch, bar, kEveryCta);
  }

  // Publishes announcement a (kNoTile past the last tile) in its slot, once the consumers have
  // read that slot's previous tile for the last time (first pass: fresh barriers, parity 1
  // passes at once); tile_full's arrival (release) makes it visible.
  __device__ __forceinline__ void publish(const TileAnnouncement& a, const TileRing& ring) const {
    const int slot = ring.announcement_slot();
    ptx::mbarrier_wait(&smem.tile_empty[slot], ring.announcement_phase() ^ 1);
    announce(smem.tile[slot], a);
    ptx::mbarrier_arrive(&smem.tile_full[slot]);
  }

  // After kNoTile: the Q ring's next phase is completed without a load, once its buffer is free as
  // for a load (the last tile's Q may still be landing in it: an arrival before that would count
  // towards the load's phase). No consumer waits for this phase, but without it ptxas allocates
  // the consumers' registers differently (d256: 850-950 B of spills in the epilogue).
  __device__ __forceinline__ void close_q_ring(const TileRing& ring) const {
    const QSlot slot = q_slot<Cfg>(ring, 0, params.features);
    ptx::mbarrier_wait(&smem.q_empty[slot.index], slot.phase ^ 1);
    ptx::mbarrier_arrive(&smem.q_full[slot.index]);
  }

  // Loads tile t's Q into its slot at ring once that slot is free: the whole tile, or with
  // kWarpgroupQ the rows of warpgroup `warpgroup`.
  __device__ __forceinline__ void load_q(const WorkTile& t, const TileAnnouncement& a, const TileRing& ring,
                                         int warpgroup) const {
    const QSlot slot = q_slot<Cfg>(ring, warpgroup, params.features);
    // The slot was the O staging of an earlier tile (or, with O staged in K/V, that tile's Q
    // until its last Q K^T): wait until every warp that read it has let it go (first pass:
    // fresh barriers, parity 1 passes at once).
    if (warpgroup == 0) FUSEDATTN_SM90_STAMP(params, TraceEvent::kQWaitStart, kProducerRole, a.index, 0);
    ptx::mbarrier_wait(&smem.q_empty[slot.index], slot.phase ^ 1);
    uint64_t* q_full = &smem.q_full[slot.index];
    ptx::mbarrier_arrive_expect_tx(q_full, kQSlotBytes);
    // The Q map is grouped (kernel_params.h): a tile's first row, and a warpgroup's, is a whole
    // position.
    const int first_row = t.first_row + (Cfg::kWarpgroupQ ? warpgroup * kWarpgroupRows : 0);
    const int row = t.q_start + params.packing.position(first_row);
#pragma unroll
    for (int s = 0; s < Cfg::kSlabs; ++s)
      ptx::tma_load_5d(smem.q[slot.index] + s * kQSlabElems, &params.tma_q, s * Cfg::kSlabCols, 0, row, t.head,
                       params.map_batch(t.batch), q_full);
    if (warpgroup == 0) FUSEDATTN_SM90_STAMP(params, TraceEvent::kQIssued, kProducerRole, a.index, 0);
  }

  // In a cluster, before the CTA exits: every K/V stage acquired once more, and every O staged
  // in K/V waited for, so the peer's consumers have made their last arrivals on this CTA's empty
  // and o_read barriers (the CTA's shared memory lives while this thread does). A cluster barrier
  // after the roles' branches would do the same for every thread, but it made ptxas spill the
  // consumers (172 B at d128).
  __device__ __forceinline__ void drain(const KVPipeline<Storage>& pipe, KVRingState<Cfg> kv, StagedO staged) const {
    const Features& f = params.features;
    for (int s = 0; s < f.num_stages || s < f.num_v_stages; ++s) {
      if (s < f.num_stages) pipe.producer_acquire_k(kv);
      if (s < f.num_v_stages) pipe.producer_acquire_v(kv);
      kv.advance(f);
    }
    if constexpr (Cfg::kStagesOInKV) {
      for (int s = 0; s < Cfg::kStages; ++s) {
        staged.wait_read(smem, s, 0);
        staged.wait_read(smem, s, 1);
      }
    }
  }

  // Whether the launch may hand items out by its counter in a cluster (masked clusters; full
  // masks' clusters walk their equal items statically, tile_scheduler.cuh).
  static constexpr bool kHandsOnItems = Cfg::kClusterCtas > 1 && kMask != MaskKind::kFull;

  __device__ __forceinline__ static int cluster_rank() {
    return Cfg::kClusterCtas > 1 ? static_cast<int>(ptx::cluster_ctarank()) : 0;
  }

  // Whether this launch does hand its items on: a masked cluster with the launch's counter (without
  // one, as in a graph capture, every CTA walks the static round robin and nothing is handed on).
  __device__ __forceinline__ bool hands_on() const { return kHandsOnItems && params.tile_counter != nullptr; }

  // The work item after t. In a cluster whose launch hands items out by a counter, rank 0 fetches
  // it and stores it into every peer's slot of this fetch once that peer has read the slot's
  // previous item; each peer waits for its slot. Fetch f of a CTA (the first tile comes from the
  // block index, so f = the tiles before the next one - 1) takes slot f % 2, use f / 2.
  template <class Scheduler>
  __device__ __forceinline__ WorkTile next_tile(const Scheduler& scheduler, const WorkTile& t,
                                                const TileRing& ring) const {
    if constexpr (kHandsOnItems) {
      // Masked launches split no tile, so this is scheduler.next(t) with the fetch handed on.
      const bool sends = cluster_rank() == 0;
      int index;
      if (!hands_on() || sends) index = scheduler.fetch(t.index);
      if (hands_on()) {
        const uint32_t f = ring.tiles() - 1;
        const int slot = static_cast<int>(f & 1);
        const uint32_t parity = f >> 1 & 1;
        // One wait for both roles (with a wait loop in each branch this kernel spilled 8 B): rank 0
        // until the peers have read the slot's previous item (first use: fresh barriers, parity 1
        // passes at once), a peer until the item has landed.
        if (!sends) ptx::mbarrier_arrive_expect_tx(&smem.fetch_full[slot], sizeof(int));
        ptx::mbarrier_wait(sends ? &smem.fetch_empty[slot] : &smem.fetch_full[slot], parity ^ (sends ? 1u : 0u));
        if (sends) {
          for (uint32_t rank = 1; rank < Cfg::kClusterCtas; ++rank)
            ptx::store_to_cta(&smem.fetched[slot], index, &smem.fetch_full[slot], rank);
        } else {
          index = *static_cast<volatile int*>(&smem.fetched[slot]);
          ptx::mbarrier_arrive_cluster(&smem.fetch_empty[slot], 0);
        }
      }
      return scheduler.at(index, Scheduler::kShareStart, t.batch, t.batch_first);
    } else {
      return scheduler.next(t);
    }
  }

  // Rank 0 of a cluster with a counter, before it exits: every peer's arrival for the last item
  // of each slot has landed (at kNoTile, ring.tiles() fetches were made; earlier uses of a slot
  // were waited for before its next store).
  __device__ __forceinline__ void wait_fetches_read(const TileRing& ring) const {
    if (!hands_on() || cluster_rank() != 0) return;
    const uint32_t fetches = ring.tiles();
    for (uint32_t f = fetches > 2 ? fetches - 2 : 0; f < fetches; ++f)
      ptx::mbarrier_wait(&smem.fetch_empty[f & 1], f >> 1 & 1);
  }

  __device__ __forceinline__ void run() const {
    const FwdParams& p = params.p;
    const KVPipeline<Storage> pipe{smem};
    // GQA/MQA: tile heads per KV head (query heads per KV head, or 1 where a tile packs them all).
    const int tile_heads = params.packing.tile_heads(p.heads_q);
    const int group = tile_heads / p.heads_kv;
    const bool o_in_kv = stages_o_in_kv<Cfg>(params.features);
    KVRingState<Cfg> kv;
    TileRing ring;
    StagedO staged;
    // With one Q buffer, Q waits for the previous tile's epilogue (unless o_in_kv gives it back
    // earlier), so the first K goes out before that wait; with two, Q's buffer is free long
    // before and goes first, as does warpgroup 0's slot with warpgroup Q slots.
    const bool q_first = Cfg::kWarpgroupQ || q_ring_depth<Cfg>(params.features) > 1;
    using Scheduler = TileScheduler<kMask == MaskKind::kFull, Cfg::kClusterCtas>;
    const Scheduler scheduler(p, params.num_m_blocks, Cfg::kBlockM, tile_heads, params.packing, params.schedule_shift,
                              params.split, params.tile_counter);
    // K (kPart 0) or V (kPart 1) of block n into the stage at kv, once the stage's previous K or V
    // has been consumed (and an O staged there has been read by its store).
    const auto load = [&](auto part, const WorkTile& t, const KVCoordinates& at, int head_kv) {
      constexpr int kPart = decltype(part)::value;
      const int s = kPart == 0 ? kv.k().stage() : kv.v().stage();
      if (o_in_kv) staged.wait_read(smem, s, kPart);
      if constexpr (kPart == 0) pipe.producer_acquire_k(kv);
      else pipe.producer_acquire_v(kv);
      uint64_t* full = kPart == 0 ? &smem.k_full[s] : &smem.v_full[s];
      // In a cluster the whole block still lands here: this CTA's rows and the peer's.
      ptx::mbarrier_arrive_expect_tx(full, kKVBytes);
      const CUtensorMap* map = kPart == 0 ? &params.tma_k : &params.tma_v;
      Element* stage = kPart == 0 ? smem.k[s] : smem.v[s];
      if constexpr (Cfg::kClusterCtas == 1) load_tile(map, stage, kKVSlabElems, at.row, head_kv, at.batch, full);
      else load_cluster_share(map, stage, at.row, head_kv, at.batch, full);
    };
    constexpr std::integral_constant<int, 0> kK{};
    constexpr std::integral_constant<int, 1> kV{};
    for (WorkTile t = scheduler.first(params.item_offset);; t = next_tile(scheduler, t, ring)) {
      const bool valid = scheduler.is_valid(t);
      // Worked out and published before any wait for a buffer: the consumers set the tile up from it
      // while they still wait for its Q.
      using Mask = TileMask<kMask, Cfg::kBlockM, Cfg::kBlockN, Cfg::kClusterCtas>;
      static_assert(kMask == MaskKind::kFull || Cfg::kClusterCtas == 1 || Mask::kSlicesSkipBlocks,
                    "a masked cluster's slices skip the blocks only its later tiles see");
      const Mask mask{p, params.packing, t.len_q, t.len_k};
      const TileAnnouncement a = announcement_of(mask, t, valid, Cfg::kConsumerWarpgroups, params.split.plan.steps,
                                                 params.features.narrow_first, cluster_rank(), Cfg::kClusterCtas);
      const KVBlockRange blocks = a.blocks;
      const int head_kv = t.head / group, kv_batch = params.map_batch(t.batch);
      int n = mask.first_block(blocks);
      publish(a, ring);
      if (!valid) {  // kNoTile is out: the consumers go home
        close_q_ring(ring);
        if constexpr (Cfg::kClusterCtas > 1) {
          drain(pipe, kv, staged);
          wait_fetches_read(ring);
        }
        return;
      }
      if (q_first) load_q(t, a, ring, 0);
      // Only a tile with blocks has a block n whose page the table names.
      KVCoordinates at{};
      if (blocks.count() > 0) {
        at = kv_coordinates(t, n, kv_batch);
        load(kK, t, at, head_kv);
        // Producer stamps record no block count (trace.h): with it live here, the trace build of
        // the paired d256 kernel spilled 260 B in its consumers (docs/hopper.md, session 73).
        FUSEDATTN_SM90_STAMP(params, TraceEvent::kFirstKIssued, kProducerRole, a.index, 0);
      }
      if (!q_first) load_q(t, a, ring, 0);
      if constexpr (Cfg::kWarpgroupQ) load_q(t, a, ring, 1);
      if (blocks.count() > 0) {
        load(kV, t, at, head_kv);
        kv.advance(params.features);
      }
      for (n = mask.next_block(n); mask.block_in_loop(blocks, n); n = mask.next_block(n)) {
        at = kv_coordinates(t, n, kv_batch);
        load(kK, t, at, head_kv);
        load(kV, t, at, head_kv);
        kv.advance(params.features);
      }
      FUSEDATTN_SM90_STAMP(params, TraceEvent::kLastLoadIssued, kProducerRole, a.index, 0);
      // The consumers stage this tile's O in its last block's stage (Epilogue::staging).
      if (o_in_kv && blocks.count() > 0) staged.mark(kv.k().previous_stage(params.features.num_stages));
      ring.advance();
    }
  }
};

}  // namespace fusedattn::cuda::sm90
