// The producer under a column mask (MaskKind::kColumn): the whole producer warp runs the tile
// loop, because it walks each tile's seen KV blocks a warp at a time (ColumnBlockWalk,
// column_mask.cuh); lane 0 alone does what the plain producer's elected thread does (the
// schedule's fetch, the announcement, every barrier and TMA load), with Producer's own helpers.
// Per tile: the window's blocks (TileMask, as for MaskKind::kWindow), of them the seen ones
// counted and announced as blocks [0, seen) (the consumers' loop counts them; which block each is
// comes with its K stage's tag), then Q, and K/V of each seen block, highest first.
//
// Off for the kind (dispatch and the launcher keep such launches away): CTA pairs (no cluster),
// tail splits (masked launches never split), GQA packing (a tile's rows would be several heads,
// whose masks may differ: fwd_split.h, tiled_rows), paged K/V and seqused_k (dense calls only),
// warpgroup Q slots and O staged in K/V (d256 only), the narrow first block.
#pragma once

#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/column_mask.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/producer.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/tile_announcement.cuh"
#include "cuda/sm90/tile_scheduler.cuh"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg, MaskKind kMask>
struct ColumnProducer {
  static_assert(kMask == MaskKind::kColumn);
  static_assert(Cfg::kClusterCtas == 1 && !Cfg::kWarpgroupQ && !Cfg::kStagesOInKV,
                "column masks run unpaired tiles with whole-tile Q slots and O staged in them");
  using Storage = SharedStorage<Element, Cfg>;
  using Base = Producer<Element, Cfg, kMask>;
  using Mask = TileMask<kMask, Cfg::kBlockM, Cfg::kBlockN>;
  using Scheduler = TileScheduler<false>;  // masked launches never split their tiles

  const KernelParams& params;
  Storage& smem;

  // The CTA's next tile of a dense batch: lane 0 fetches (one atomic for the warp), every lane
  // decodes it.
  __device__ __forceinline__ static WorkTile next_tile(const Scheduler& scheduler, int index, int lane) {
    const int fetched = lane == 0 ? scheduler.fetch(index) : 0;
    return scheduler.tile_at(__shfl_sync(0xffffffffu, fetched, 0), Scheduler::kShareStart);
  }

  // All 32 lanes of the producer warp.
  __device__ __forceinline__ void run(int lane) const {
    const Base base{params, smem};
    const FwdParams& p = params.p;
    const bool leader = lane == 0;
    const KVPipeline<Storage> pipe{smem};
    const int group = p.heads_q / p.heads_kv;  // unpacked: a tile head is a query head
    KVRingState<Cfg> kv;
    TileRing ring;
    const Scheduler scheduler(p, params.num_m_blocks, Cfg::kBlockM, p.heads_q, params.packing, params.schedule_shift,
                              params.split, params.tile_counter);
    // Lane 0: K (kPart 0, with the block's tag) or V (kPart 1) of block n into the stage at kv,
    // once that stage's previous K or V has been consumed.
    const auto load = [&](auto part, const WorkTile& t, int n, int tag, int head_kv) {
      constexpr int kPart = decltype(part)::value;
      const int s = kPart == 0 ? kv.k().stage() : kv.v().stage();
      if constexpr (kPart == 0) {
        pipe.producer_acquire_k(kv);
        write_column_tag(smem.column_tag[s], tag);
      } else {
        pipe.producer_acquire_v(kv);
      }
      uint64_t* full = kPart == 0 ? &smem.k_full[s] : &smem.v_full[s];
      ptx::mbarrier_arrive_expect_tx(full, Base::kKVBytes);
      const CUtensorMap* map = kPart == 0 ? &params.tma_k : &params.tma_v;
      Element* stage = kPart == 0 ? smem.k[s] : smem.v[s];
      base.load_tile(map, stage, Base::kKVSlabElems, n * Cfg::kBlockN, head_kv, t.batch, full);
    };
    constexpr std::integral_constant<int, 0> kK{};
    constexpr std::integral_constant<int, 1> kV{};
    for (WorkTile t = scheduler.first();; t = next_tile(scheduler, t.index, lane)) {
      const bool valid = scheduler.is_valid(t);
      const Mask mask{p, params.packing, t.len_q, t.len_k};
      // The window's blocks, of them those the column mask leaves some row of the tile: counted
      // before the announcement is made, so that it is built and published in one go (its words
      // live across nothing else: the producer warp has few registers, kColumnProducerRegisters).
      ColumnBlockWalk walk{};
      int seen = 0;
      if (valid) {
        const KVBlockRange window = mask.kv_blocks(t.first_row);
        // The tile's real rows: those past the sequence are never stored, so they need nothing.
        const int row_end = t.first_row + Cfg::kBlockM < t.len_q ? t.first_row + Cfg::kBlockM : t.len_q;
        walk = {ColumnMaskView::of(p, params.columns, t.batch, t.head), window.lo, t.first_row, row_end};
        seen = walk.count(window.hi, lane);
      }
      if (leader) {
        TileAnnouncement a = announcement_of(mask, t, valid, Cfg::kConsumerWarpgroups, params.split.plan.steps, false);
        // The consumers' loop counts the seen blocks; each one's index comes with its K stage.
        a.blocks = {0, seen};
#pragma unroll
        for (int wg = 0; wg < kMaxConsumerWarpgroups; ++wg) a.visible[wg] = a.blocks;
        base.publish(a, ring);
        // kNoTile is out: the consumers go home. Else Q first, with one Q buffer too (that Q
        // then waits for the previous tile's O store before this tile's first K is issued).
        if (!valid) base.close_q_ring(ring);
        else base.load_q(t, a, ring, 0);
      }
      if (!valid) return;
      const int head_kv = t.head / group;
      for (int left = seen; left > 0; --left) {
        const int tag = walk.next(lane);
        if (leader) {
          load(kK, t, ColumnTag::block(tag), tag, head_kv);
          load(kV, t, ColumnTag::block(tag), tag, head_kv);
        }
        kv.advance(params.features);
      }
      ring.advance();
    }
  }
};

}  // namespace fusedattn::cuda::sm90
