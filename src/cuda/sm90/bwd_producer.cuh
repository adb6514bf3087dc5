// The Hopper backward's producer warpgroup (bwd_kernel.cuh runs it at setmaxnreg's minimum): the
// loader warp's one thread issues every TMA load of the CTA, and the dQ writer warp adds each
// query block's dQ, staged by the compute warpgroups, to the fp32 workspace by TMA reductions.
// Both meet the compute warpgroups only on the mbarriers of BwdSharedStorage.
#pragma once

#include <cstdint>

#include <cuda/atomic>

#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm80/bwd_mask.h"
#include "cuda/sm80/bwd_shared.cuh"
#include "cuda/sm80/bwd_workspace.h"
#include "cuda/sm90/bwd_tile.h"
#include "cuda/sm90/pipeline.cuh"  // RingUse

namespace fusedattn::cuda::sm90 {

// The producer warpgroup's two working warps.
constexpr int kLoaderWarp = 0;
constexpr int kDqWriterWarp = 1;

// The CTA's producer roles over its item: cta and first (its first query head and block) as
// bwd_kernel.cuh set them up.
template <typename Element, int kHeadDim>
struct BwdProducer {
  using T = BwdTile<kHeadDim>;
  using Storage = BwdSharedStorage<Element, kHeadDim>;
  using Cursor = sm80::QueryCursor<false>;
  static constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;

  const BwdParams& p;
  const sm80::BwdWorkspace& ws;
  const BwdMaps* maps;
  const sm80::BwdCoords& cta;
  const Cursor& first;
  Storage& smem;

  __device__ __forceinline__ void load_operands(int64_t key0) const;  // the loader warp's elected thread
  __device__ __forceinline__ void write_dq(int lane) const;          // the dQ writer warp
};

template <typename Element, int kHeadDim>
__device__ __forceinline__ void BwdProducer<Element, kHeadDim>::load_operands(int64_t key0) const {
  // K and V once (V after the first block's loads), then each query block's Q, dO, lse2 and
  // delta into the stage its last use has left, all by TMA from one thread: each barrier's
  // arrival announces the bytes. Rows past the tensors' rows in use read as zeros; in a
  // variable-length batch, rows past a sequence are the next one's, which the masks and
  // lse2 = +inf give no weight (as the forward's loads). Three loader warps copying by
  // cp.async at the producer's 24 registers kept the compute warpgroups waiting on q_full
  // (session 61: 0.66-0.70x cuDNN; by TMA 0.93-0.99x).
  const int batch = map_batch(p, cta.b);
  // K (or V) whole onto its barrier. K goes first and V after the first block's Q and dO: the
  // first S^T needs only K and Q, and V lands under it.
  const int key_row = static_cast<int>(cta.seq.k_start + key0);
  auto load_keys = [&](Element* tile, const CUtensorMap* map, uint64_t* full) {
    ptx::mbarrier_arrive_expect_tx(full, Storage::kKeyTileBytes);
#pragma unroll
    for (int slab = 0; slab < kHeadDim / kBwdSlabElems; ++slab)
      ptx::tma_load_4d(tile + slab * kBlockN * kBwdSlabElems, map, slab * kBwdSlabElems, key_row, cta.kvh, batch, full);
  };
  if (cta.iterations > 0) load_keys(smem.k, &maps->k, &smem.k_full);
  Cursor cur = first;
  for (int it = 0; it < cta.iterations; ++it, cur.advance(cta)) {
    const RingUse<T::kStages> use(it);
    const int stage = use.slot;
    ptx::mbarrier_wait(&smem.q_empty[stage], use.empty_parity());
    uint64_t* full = &smem.q_full[stage];
    ptx::mbarrier_arrive_expect_tx(full, 2 * Storage::kQueryTileBytes + 2 * Storage::kRowBytes);
    const int row0 = cur.m * kBlockM;  // a sequence has fewer than 2^31 rows (dispatch)
    const int query_row = static_cast<int>(cta.seq.q_start) + row0;
#pragma unroll
    for (int slab = 0; slab < kHeadDim / kBwdSlabElems; ++slab) {
      const int col = slab * kBwdSlabElems, at = slab * kBlockM * kBwdSlabElems;
      ptx::tma_load_4d(smem.stage[stage].q + at, &maps->q, col, query_row, cur.h, batch, full);
      ptx::tma_load_4d(smem.stage[stage].dout + at, &maps->dout, col, query_row, cur.h, batch, full);
    }
    // Whole kBlockM-row blocks of lse2 and delta, 16-byte aligned: the workspace pads each
    // (batch, head)'s rows to kBwdRowPad.
    static_assert(sm80::kBwdRowPad % kBlockM == 0, "query blocks tile the workspace's row padding");
    const int64_t ws_row = ws.row_base(p, cta.b, cur.h) + row0;
    ptx::bulk_load(smem.rows[stage].lse2, ws.lse2 + ws_row, Storage::kRowBytes, full);
    ptx::bulk_load(smem.rows[stage].delta, ws.delta + ws_row, Storage::kRowBytes, full);
    if (it == 0) load_keys(smem.v, &maps->v, &smem.v_full);
  }
}

template <typename Element, int kHeadDim>
__device__ __forceinline__ void BwdProducer<Element, kHeadDim>::write_dq(int lane) const {
  constexpr int kBoxesPerWarpgroup = Storage::kDqBoxesPerWarpgroup;
  // Deterministic calls (ws.dq_sem set) add each query block's dQ in ascending KV block order,
  // as the portable kernel does (sm80/bwd_tile_io.cuh, ordered_add_dq): before a block's
  // reductions the writer waits until the block's semaphore counts the KV blocks before this
  // one; after them it waits for them to complete and passes the turn on. Lower KV blocks of
  // a head start first (grid_item), so the wait ends. Lane 0 alone.
  const bool ordered = ws.dq_sem != nullptr;
  auto await_turn = [&](int h, int m) -> int32_t* {
    if (!ordered) return nullptr;
    int32_t* sem = ws.dq_sem + (ws.row_base(p, cta.b, h) + static_cast<int64_t>(m) * kBlockM) / sm80::kBwdSemRows;
    const int64_t first_kv = sm80::first_kv_block_of_query_block(p, m, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);
    const ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device> turn(*sem);
    while (turn.load(::cuda::memory_order_acquire) != static_cast<int32_t>(cta.n - first_kv)) {
    }
    ptx::fence_proxy_async_global();  // the earlier blocks' adds before this one's
    return sem;
  };
  auto pass_turn = [](int32_t* sem) {
    if (sem == nullptr) return;
    ptx::tma_store_wait_all();
    ptx::fence_proxy_async_global();
    ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>(*sem).fetch_add(1, ::cuda::memory_order_release);
  };
  // After a block's reductions are issued: once they have read its staging, the staging goes back
  // (its empty barrier) and, in a deterministic call, the turn on.
  auto hand_back = [&](uint64_t* empty, int32_t* sem) {
    ptx::tma_store_commit();
    ptx::tma_store_wait_read();
    ptx::mbarrier_arrive(empty);
    pass_turn(sem);
  };
  // One box of dQ added into the workspace at (row, col) of head h; boxes wholly past the
  // head dim are left out. Where the staged rows are interleaved the map's coordinates are the
  // workspace row's group of kDqRowGroup rows (dq_rows.h, make_dq_tensor_map).
  auto reduce_box = [&](uint32_t box, int col, int row, int h) {
    if (col >= p.head_dim) return;
    if constexpr (T::kDqInterleaved) {
      // In 32 bits (the producer's register budget): make_dq_tensor_map checks that the rows fit.
      const int32_t ws_row = (cta.b * p.heads_q + h) * static_cast<int32_t>(ws.rows) + row;
      ptx::tma_reduce_add_4d(&maps->dq, box, col, 0, 0, ws_row / kDqRowGroup);
    } else {
      ptx::tma_reduce_add_4d(&maps->dq, box, col, row, h, cta.b);
    }
  };
  if constexpr (T::kDqStaged) {
    // Each block's dQ, once both warpgroups staged their tiles: one TMA reduction per box
    // (kDqRows x 32 columns) into the workspace, read before the staging is handed back.
    const int m_begin = static_cast<int>(cta.m_blocks.begin), m_end = static_cast<int>(cta.m_blocks.end);
    const int h_begin = cta.kvh * cta.group, h_end = h_begin + (m_end > m_begin ? cta.group : 0);
    int it = 0;
    for (int h = h_begin; h < h_end; ++h)
      for (int m = m_begin; m < m_end; ++m, ++it) {
        const RingUse<T::kDqBuffers> use(it);
        const int buf = use.slot;
        ptx::mbarrier_wait(&smem.dq_full[buf], use.full_parity);
        if (lane == 0) {
          int32_t* const sem = await_turn(h, m);
#pragma unroll
          for (int box = 0; box < Storage::kDqBoxes; ++box) {
            const int w = box / kBoxesPerWarpgroup, i = box % kBoxesPerWarpgroup;
            reduce_box(ptx::smem_addr(smem.scratch.slab[buf][box]), T::dq_col0(w) + i * Storage::kDqSlabFloats,
                       m * kBlockM + T::dq_row0(w), h);
          }
          hand_back(&smem.dq_empty[buf], sem);
        }
        __syncwarp();
      }
  } else {
    // d256 (kDqInStage): each block's dQ, once both warpgroups staged it in the block's stage:
    // one TMA reduction per box; the stage goes back to the producer once they have read it.
    Cursor cur = first;
    for (int it = 0; it < cta.iterations; ++it, cur.advance(cta)) {
      const RingUse<T::kStages> use(it);
      const int stage = use.slot;
      ptx::mbarrier_wait(&smem.dq_in_stage[stage], use.full_parity);
      if (lane == 0) {
        int32_t* const sem = await_turn(cur.h, cur.m);
#pragma unroll
        for (int box = 0; box < kHeadDim / Storage::kDqSlabFloats; ++box)
          reduce_box(smem.dq_box_in_stage(stage, box), box * Storage::kDqSlabFloats, cur.m * kBlockM, cur.h);
        hand_back(&smem.q_empty[stage], sem);
      }
      __syncwarp();
    }
  }
  // The CTA's shared memory must outlive the reductions' reads of it.
  if (lane == 0) ptx::tma_store_wait_all();
}

}  // namespace fusedattn::cuda::sm90
