// The producer warpgroup: one elected thread owns the tile schedule and issues every TMA load.
// Per tile: K of the first (highest) visible KV block, then -- once the previous tile's O has
// left the Q buffer -- the tile's index for the consumers and Q, then V, then K/V pairs for the
// remaining blocks, each stage acquired from the ring before it is overwritten. After the last
// tile it publishes kNoTile, which sends the consumers home.
#pragma once

#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/tile_scheduler.cuh"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg, MaskKind kMask>
struct Producer {
  using Storage = SharedStorage<Element, Cfg>;
  static constexpr uint32_t kQBytes = Storage::kQElems * sizeof(Element);
  static constexpr uint32_t kKVBytes = Storage::kKVElems * sizeof(Element);
  static constexpr int kQSlabElems = Cfg::kBlockM * Cfg::kSlabCols;
  static constexpr int kKVSlabElems = Cfg::kBlockN * Cfg::kSlabCols;

  const KernelParams& params;
  Storage& smem;

  // A [rows x kHeadDim] tile as kSlabs boxes of [rows x 64], each into its own swizzled slab.
  __device__ __forceinline__ void load_tile(const CUtensorMap* map, Element* dst, int slab_elems, int row, int head, int batch,
                            uint64_t* bar) const {
#pragma unroll
    for (int s = 0; s < Cfg::kSlabs; ++s)
      ptx::tma_load_4d(dst + s * slab_elems, map, s * Cfg::kSlabCols, row, head, batch, bar);
  }

  __device__ __forceinline__ void run() const {
    const FwdParams& p = params.p;
    ptx::tma_prefetch_descriptor(&params.tma_q);
    ptx::tma_prefetch_descriptor(&params.tma_k);
    ptx::tma_prefetch_descriptor(&params.tma_v);
    const KVPipeline<Storage> pipe{smem};
    const TileMask<kMask, Cfg::kBlockM, Cfg::kBlockN> mask{p};
    const int group = p.heads_q / p.heads_kv;  // GQA/MQA: query heads per KV head
    PipelineState kv;
    kv.num_stages = params.features.num_stages;
    uint32_t tile_parity = 0;
    const TileScheduler scheduler(params.num_m_blocks, p.heads_q, p.batch, params.tile_counter);
    for (WorkTile t = scheduler.first();; t = scheduler.next(t)) {
      const bool valid = scheduler.is_valid(t);
      const KVBlockRange blocks = valid ? mask.kv_blocks(t.m_block) : KVBlockRange{0, 0};
      const int head_kv = t.head / group;
      int n = blocks.hi - 1;
      if (blocks.count() > 0) {
        pipe.producer_acquire_k(kv);
        ptx::mbarrier_arrive_expect_tx(&smem.k_full[kv.stage], kKVBytes);
        load_tile(&params.tma_k, smem.k[kv.stage], kKVSlabElems, n * Cfg::kBlockN, head_kv, t.batch,
                  &smem.k_full[kv.stage]);
      }
      // The Q buffer doubles as the previous tile's O staging: wait until both warpgroups' TMA
      // stores have read it (first tile: a fresh barrier, parity 1 passes at once). By then the
      // consumers have also read the previous tile index, so it can be overwritten; q_full's
      // arrival (release) publishes it. Atomic on both sides: the mbarriers already order the
      // accesses, but compute-sanitizer's racecheck does not follow that chain and flags plain
      // ones, while atomics are never a data race.
      ptx::mbarrier_wait(&smem.q_empty, tile_parity ^ 1);
      atomicExch(&smem.tile_index, valid ? t.index : kNoTile);
      if (!valid) {
        ptx::mbarrier_arrive(&smem.q_full);
        return;
      }
      ptx::mbarrier_arrive_expect_tx(&smem.q_full, kQBytes);
      load_tile(&params.tma_q, smem.q, kQSlabElems, t.m_block * Cfg::kBlockM, t.head, t.batch, &smem.q_full);
      if (blocks.count() > 0) {
        pipe.producer_acquire_v(kv);
        ptx::mbarrier_arrive_expect_tx(&smem.v_full[kv.stage], kKVBytes);
        load_tile(&params.tma_v, smem.v[kv.stage], kKVSlabElems, n * Cfg::kBlockN, head_kv, t.batch,
                  &smem.v_full[kv.stage]);
        kv.advance();
      }
      for (--n; n >= blocks.lo; --n) {
        pipe.producer_acquire_k(kv);
        ptx::mbarrier_arrive_expect_tx(&smem.k_full[kv.stage], kKVBytes);
        load_tile(&params.tma_k, smem.k[kv.stage], kKVSlabElems, n * Cfg::kBlockN, head_kv, t.batch,
                  &smem.k_full[kv.stage]);
        pipe.producer_acquire_v(kv);
        ptx::mbarrier_arrive_expect_tx(&smem.v_full[kv.stage], kKVBytes);
        load_tile(&params.tma_v, smem.v[kv.stage], kKVSlabElems, n * Cfg::kBlockN, head_kv, t.batch,
                  &smem.v_full[kv.stage]);
        kv.advance();
      }
      tile_parity ^= 1;
    }
  }
};

}  // namespace fusedattn::cuda::sm90
