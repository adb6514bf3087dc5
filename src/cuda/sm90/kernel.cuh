// The Hopper forward kernel shell: it only splits roles. Warpgroup 0 produces (TMA loads, few
// registers; one elected thread, or under a column mask its first warp: column_producer.cuh);
// warpgroups 1 .. Cfg::kConsumerWarpgroups consume (wgmma + softmax + epilogue, many registers),
// each owning 64 rows of every query tile. The producer picks the tiles (tile_scheduler.cuh)
// and announces each one in shared memory ahead of its Q (tile_full, tile_announcement.cuh);
// consecutive tiles take the announcement slots and the Q buffers in turn (TileRing; rings like
// the K/V stages, the Q ring of depth features.q_buffers).
#pragma once

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/column_producer.cuh"
#include "cuda/sm90/consumer.cuh"
#include "cuda/sm90/epilogue.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/producer.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/tile_announcement.cuh"
#include "cuda/sm90/trace.cuh"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg, MaskKind kMask>
__device__ void init_barriers(SharedStorage<Element, Cfg>& smem) {
  constexpr uint32_t kProducerArrivals = 1;  // the elected thread's arrive.expect_tx
  // A Q slot is read by every consumer warp, or with kWarpgroupQ by one warpgroup's.
  constexpr uint32_t kQSlotReaders = Cfg::kWarpgroupQ ? kWarpsPerWarpgroup : Cfg::kConsumerWarps;
  for (int b = 0; b < Cfg::kQSlots; ++b) {
    ptx::mbarrier_init(&smem.q_full[b], kProducerArrivals);
    ptx::mbarrier_init(&smem.q_empty[b], kQSlotReaders);
  }
  for (int slot = 0; slot < kAnnouncementSlots; ++slot) {
    ptx::mbarrier_init(&smem.tile_full[slot], kProducerArrivals);  // the announcement's plain arrive
    ptx::mbarrier_init(&smem.tile_empty[slot], Cfg::kConsumerWarps);
  }
  // A cluster's handed-on items (Producer::next_tile): a peer's own expect_tx (the store completes
  // the bytes); on rank 0, one arrival of each peer.
  if constexpr (Producer<Element, Cfg, kMask>::kHandsOnItems) {
    for (int slot = 0; slot < kAnnouncementSlots; ++slot) {
      ptx::mbarrier_init(&smem.fetch_full[slot], kProducerArrivals);
      ptx::mbarrier_init(&smem.fetch_empty[slot], Cfg::kClusterCtas - 1);
    }
  }
  // The staging warpgroup's store, in every CTA of the cluster (Producer::StagedO).
  for (int s = 0; s < Cfg::kStages; ++s)
    for (int part = 0; part < 2; ++part) ptx::mbarrier_init(&smem.o_read[s][part], Cfg::kClusterCtas);
  // A K/V stage is free once every consumer warp of every CTA it is multicast to has read it.
  constexpr uint32_t kStageReaders = Cfg::kConsumerWarps * Cfg::kClusterCtas;
  for (int s = 0; s < Cfg::kStages; ++s) {
    ptx::mbarrier_init(&smem.k_full[s], kProducerArrivals);
    ptx::mbarrier_init(&smem.k_empty[s], kStageReaders);
  }
  for (int s = 0; s < Cfg::kVStages; ++s) {
    ptx::mbarrier_init(&smem.v_full[s], kProducerArrivals);
    ptx::mbarrier_init(&smem.v_empty[s], kStageReaders);
  }
  ptx::fence_barrier_init();
}

template <typename Element, class Cfg, MaskKind kMask>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm) fwd_kernel(const __grid_constant__ KernelParams params) {
  extern __shared__ __align__(1024) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<SharedStorage<Element, Cfg>*>(smem_bytes);
  // Warpgroup and warp index broadcast from lane 0: the same value, but one ptxas knows to be
  // warp-uniform, so what derives from it (the descriptors' shared-memory addresses, the pipeline
  // stages, the tile loop's bounds) can live in uniform registers next to the wgmma issue.
  const auto warp_uniform = [](int x) { return __shfl_sync(0xffffffffu, x, 0); };
  const int warpgroup = warp_uniform(static_cast<int>(threadIdx.x) / kWarpgroupThreads);
  const int warp = warp_uniform(static_cast<int>(threadIdx.x) % kWarpgroupThreads / 32);
  const int lane = static_cast<int>(threadIdx.x) % 32;

  if (threadIdx.x == 0) {
    init_barriers<Element, Cfg, kMask>(smem);
    FUSEDATTN_SM90_TRACE_RESET();  // the trace build's stamp counters (trace.cuh), else nothing
    // The maps are kernel parameters, which no kernel before this one writes: fetched into the
    // descriptor cache while a dependent launch still waits below. Thread 0 is the producer warp's
    // first lane, the thread that issues the loads.
    ptx::tma_prefetch_descriptor(&params.tma_q);
    ptx::tma_prefetch_descriptor(&params.tma_k);
    ptx::tma_prefetch_descriptor(&params.tma_v);
  }
  __syncthreads();
  // The peer's barriers are initialised before this CTA arrives on them or multicasts into it.
  if constexpr (Cfg::kClusterCtas > 1) ptx::cluster_sync();
  // A dependent launch (fwd_launch.cuh, dependent_launch) may start while the kernel before it on
  // the stream still runs. Up to here the CTA has touched only shared memory and its parameters;
  // from here on it reads its inputs and writes its outputs, so every thread first waits until
  // that kernel has completed and its writes are visible (at once after an ordinary launch). Then
  // the next kernel on the stream, if launched as a dependent too, may set up on the SMs this grid
  // leaves; its own wait still holds it until this grid has completed.
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();

  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kMask == MaskKind::kColumn ? kColumnProducerRegisters : kProducerRegisters>();
    if constexpr (kMask == MaskKind::kColumn) {
      // The column walk reads the mask's summary a warp at a time (column_producer.cuh).
      if (warp == 0) ColumnProducer<Element, Cfg, kMask>{params, smem}.run(lane);
    } else if (warp == 0 && ptx::elect_one_sync()) {
      Producer<Element, Cfg, kMask>{params, smem}.run();
    }
  } else {
    ptx::setmaxnreg_inc<Consumer<Element, Cfg, kMask>::kRegisters>();
    const int consumer = warpgroup - 1;
    const WarpgroupTurns turns{params.features.pingpong, consumer, Cfg::kConsumerWarpgroups};
    // Warpgroup 0 issues first: the last warpgroup hands it the first turn. That leaves one
    // arrival on warpgroup 0's barrier unmatched, which its final wait_turn() below consumes.
    if (consumer == Cfg::kConsumerWarpgroups - 1) turns.pass_turn();
    Consumer<Element, Cfg, kMask> mainloop{params, smem, consumer, lane, warp};
    const Epilogue<Element, Cfg, kMask == MaskKind::kFull> epilogue{params, smem, consumer, warp, lane};
    KVRingState<Cfg> kv;
    TileRing ring;  // which Q buffer and announcement slot (and their barriers' parity) the next tile uses
    PendingStore pending;
    // The announcement in tile r's slot (announced), once the producer has published it
    // (published); each warp gives the slot back once it has read it for the last time (release).
    const auto announced = [&](const TileRing& r) {
      return read_announcement(smem.tile[r.announcement_slot()], lane, consumer);
    };
    const auto published = [&](const TileRing& r) {
      ptx::mbarrier_wait(&smem.tile_full[r.announcement_slot()], r.announcement_phase());
      return announced(r);
    };
    const auto release = [&](const TileRing& r) {
      if (lane == 0) ptx::mbarrier_arrive(&smem.tile_empty[r.announcement_slot()]);
    };
    const auto read_once = [&](const TileRing& r) {
      const AnnouncedTile a = published(r);
      release(r);
      return a;
    };
    // Where a tile with KV blocks stages O: its last block's stage (kStagesOInKV), else -1.
    const auto o_stage = [&](const AnnouncedTile& t) {
      return mainloop.o_in_kv() && t.blocks.count() > 0 ? kv.k().previous_stage(params.features.num_stages) : -1;
    };
    if constexpr (Consumer<Element, Cfg, kMask>::kCarryTileState) {
      // Registers to spare (every tile but d64's 192-row one): a tile carries its announcement
      // through to its epilogue, and the next tile's is read before that epilogue, so the read's
      // latency hides under it.
      AnnouncedTile t = read_once(ring);
      while (t.valid()) {
        // Tile-boundary trace stamps (trace.cuh; nothing unless compiled in).
        const auto stamp = [&](TraceEvent event) { mainloop.stamp(event, t.tile.index, t.blocks.count()); };
        stamp(TraceEvent::kTileStart);
        AnnouncedTile next;
        if (mainloop.slice_is_empty(t)) {
          // The sequence ends before this warpgroup's rows: it passes its GEMM turns on at once
          // (the busy warpgroups issue more often) and only keeps the K/V and Q rings in step.
          mainloop.pass_through_tile(t, ring, kv, turns, pending);
          next = read_once(ring.following());
          epilogue.skip(mainloop.q_stage, o_stage(t));
        } else {
          mainloop.mma_tile(t, ring, kv, turns, pending);
          stamp(TraceEvent::kLastPVDone);
          next = read_once(ring.following());
          epilogue.store(t.tile, mainloop.q_stage, o_stage(t), mainloop.o, mainloop.softmax, pending);
          stamp(TraceEvent::kEpilogueDone);
        }
        ring.advance();
        t = next;
      }
    } else {
      for (;; ring.advance()) {
        const AnnouncedTile t = published(ring);
        if (!t.valid()) break;
        const auto stamp = [&](TraceEvent event) { mainloop.stamp(event, t.tile.index, t.blocks.count()); };
        stamp(TraceEvent::kTileStart);
        if (mainloop.slice_is_empty(t)) {
          release(ring);
          mainloop.pass_through_tile(t, ring, kv, turns, pending);
          epilogue.skip(mainloop.q_stage, o_stage(t));
          continue;
        }
        mainloop.mma_tile(t, ring, kv, turns, pending);
        stamp(TraceEvent::kLastPVDone);
        // The epilogue reads the tile again instead of carrying it through the KV loop, where
        // its fields would take registers (the 192-row tile has 160 per thread).
        const AnnouncedTile again = announced(ring);
        release(ring);
        epilogue.store(again.tile, mainloop.q_stage, o_stage(again), mainloop.o, mainloop.softmax, pending);
        stamp(TraceEvent::kEpilogueDone);
      }
    }
    if (consumer == 0) turns.wait_turn();
    // The last tile's O staged in K/V has no next tile to sign it off behind (defer_o_read); in
    // a cluster every producer's drain waits for it (Producer::drain), so it is signed off here.
    if constexpr (Cfg::kStagesOInKV && Cfg::kClusterCtas > 1)
      if (mainloop.o_in_kv()) mainloop.release_pending(pending, kv);
    if (warp == 0 && lane == 0) ptx::tma_store_wait_all();
  }
}

}  // namespace fusedattn::cuda::sm90
