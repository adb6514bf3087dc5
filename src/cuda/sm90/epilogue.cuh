// A consumer warpgroup's epilogue: O normalised by the softmax row sums, converted to the
// element type, staged in the warpgroup's own 64 rows of the tile's Q slot, or with
// KernelConfig::kStagesOInKV in the last KV block's K (warpgroup 0, unless kWarpgroupQ gives it a
// Q slot of its own) or V (warpgroup 1) (in the
// 128B-swizzled layout of the O tensor map), and written by one TMA store per 64-column slab; the TMA clips rows
// past seqlen_q and columns past head_dim. In a variable-length batch the rows past a sequence's
// end are the next sequence's, which the TMA cannot clip: a slice that reaches past its
// sequence's end is copied row by row instead (store_rows). LSE (natural log) goes straight from
// registers. A split tile of few rows skips all of this: split_combine.cuh writes its combined rows.
#pragma once

#include <cstdint>

#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/named_barriers.h"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/split_combine.cuh"
#include "cuda/sm90/swizzled_stmatrix.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/trace.cuh"

namespace fusedattn::cuda::sm90 {

// kSplits: the launch may split tiles into parts (full masks): a part's warpgroup hands its
// result to SplitCombine and stores only if it combined the tile.
template <typename Element, class Cfg, bool kSplits>
struct Epilogue {
  using Storage = SharedStorage<Element, Cfg>;
  static constexpr int kOAcc = kWarpgroupRows * Cfg::kHeadDim / kWarpgroupThreads;
  // The staging's 16-byte swizzle chunks per slab, as store_rows copies them out.
  static constexpr int kChunksPerSlab = Cfg::kSlabCols / kSwizzleChunkElems;
  static constexpr int kSlabElems = Cfg::kQSlotRows * Cfg::kSlabCols;  // a Q slot's slab
  // Whether a slice's staging may go out as one box (KernelParams::o_one_box: a map whose box
  // takes the slabs as a dimension) rather than one box per slab: where each warpgroup's staging
  // is its slabs of 64 rows back to back (kWarpgroupQ: its own Q slot, or a 64-key K/V stage; a
  // whole Q tile's slab holds both warpgroups' rows). The TMA unit's time goes by requests more
  // than by bytes: with a request per slab warpgroup 1's stores waited ~1000 cycles behind
  // warpgroup 0's to issue, with one ~170 (docs/hopper.md, session 74).
  static constexpr bool kOneBoxStaging = Cfg::kWarpgroupQ;
  static_assert(!kOneBoxStaging || (Cfg::kQSlotRows == kWarpgroupRows && Cfg::kBlockN == kWarpgroupRows),
                "one box needs every staging's slabs to be 64 rows each, back to back");

  const KernelParams& params;
  Storage& smem;
  int warpgroup, warp, lane;

  // A trace stamp of this warpgroup (trace.cuh; nothing unless compiled in).
  __device__ __forceinline__ void stamp(TraceEvent event) const {
    FUSEDATTN_SM90_WARPGROUP_STAMP(params, event, warpgroup, warp, lane, -1, 0);
  }

  // O's rows into the staging by stmatrix (swizzled_stmatrix.cuh).
  using Stmatrix = SwizzledStmatrix<Element>;

  // Where this warpgroup stages O: its 64 rows of the Q slot q_stage, or (o_stage >= 0, see
  // in_kv) the first 64 rows of stage o_stage's K (warpgroup 0) or V (warpgroup 1). Either way
  // [64-column slab][row], slabs slab_elems apart, starting on a 1024-byte swizzle atom.
  struct Staging {
    Element* base;
    int slab_elems;
  };
  // Whether this warpgroup stages in the K/V stage o_stage (the tile's, or -1): with kWarpgroupQ
  // warpgroup 0 keeps its Q slot.
  __device__ __forceinline__ bool in_kv(int o_stage) const {
    return o_stage >= 0 && stages_own_o_in_kv<Cfg>(params.features, warpgroup);
  }
  __device__ __forceinline__ Staging staging(int q_stage, int o_stage) const {
    if (in_kv(o_stage)) return {warpgroup == 0 ? smem.k[o_stage] : smem.v[o_stage], kWarpgroupRows * Cfg::kSlabCols};
    return {smem.q[q_stage] + q_slot_first_row<Cfg>(warpgroup) * Cfg::kSlabCols, kSlabElems};
  }

  // Staging in the last block's stage (o_stage >= 0) waits until the other warpgroup has read it:
  // warpgroup 1 its K (Consumer::last_qk_done; not with kWarpgroupQ, where warpgroup 0 stages in
  // its Q slot), warpgroup 0 its V, which it says here once its last P V is done. Every tile
  // with KV blocks meets here once per warpgroup, stored or not, so the barriers stay paired.
  __device__ __forceinline__ void meet(int o_stage) const {
    if (!Cfg::kStagesOInKV || o_stage < 0) return;
    constexpr uint32_t kBoth = 2 * kWarpgroupThreads;
    if (warpgroup == 0) {
      ptx::named_barrier_arrive(barrier_id(NamedBarrier::kVStageRead, 0), kBoth);
      if constexpr (!Cfg::kWarpgroupQ) ptx::named_barrier_sync(barrier_id(NamedBarrier::kKStageRead, 0), kBoth);
    } else {
      ptx::named_barrier_sync(barrier_id(NamedBarrier::kVStageRead, 0), kBoth);
    }
  }

  // A warpgroup with no rows to store (its slice lies past the sequence end, or another part of a
  // split tile stores them) still signs off its staging: q_empty counts one arrival per warp, the
  // o_read barrier one per warpgroup; with no store reading the slot, that goes at once.
  __device__ __forceinline__ void release_unstored(int q_stage, int o_stage) const {
    if (warp != 0 || lane != 0) return;
    if (in_kv(o_stage))
      ptx::mbarrier_arrive_every_cta<Cfg::kClusterCtas>(&smem.o_read[o_stage][warpgroup]);
    else
      ptx::mbarrier_arrive(&smem.q_empty[q_stage], kWarpsPerWarpgroup);
  }

  // A warpgroup whose slice of the tile lies past the sequence end (Consumer::slice_is_empty).
  __device__ __forceinline__ void skip(int q_stage, int o_stage) const {
    meet(o_stage);
    release_unstored(q_stage, o_stage);
  }

  // o_stage: the stage of the tile's last KV block where O is staged there (kStagesOInKV, a tile
  // with KV blocks), else -1 (the Q buffer q_stage).
  __device__ __forceinline__ void store(const WorkTile& t, int q_stage, int o_stage, float (&o)[kOAcc],
                                        OnlineSoftmax& softmax, PendingStore& pending) const {
    meet(o_stage);
    stamp(TraceEvent::kEpilogueMet);
    float inv_sum[2], lse[2];
    softmax.finalize(inv_sum, lse);
    rescale_rows(o, inv_sum);
    stamp(TraceEvent::kORescaled);
    if constexpr (kSplits) {
      if (t.part != kWholeTile) {
        const SplitCombine<Element, Cfg> parts{params, smem, warpgroup};
        const uint32_t thread = static_cast<uint32_t>(ptx::thread_index_here()) % kWarpgroupThreads;
        const bool last = parts.write_part(t, o, lse, thread);
        stamp(TraceEvent::kPartTicketed);
        // Where the slice has few rows the last part writes the combined rows to O itself, past
        // the staging; a part that does not combine stores nothing. Either way the staging is
        // free once every warp's wgmma is done, which the tickets' barrier has seen.
        if (!last || parts.spreads(t)) {
          if (last) {
            parts.combine_spread_and_store(t, o, thread);
            stamp(TraceEvent::kPartsCombined);
          }
          release_unstored(q_stage, o_stage);
          return;
        }
        parts.combine(t, o, lse, thread);
        stamp(TraceEvent::kPartsCombined);
      }
    }
    stage_and_store(t, q_stage, o_stage, o, lse, pending);
  }

  // O (normalised) staged (see staging) and stored by TMA; the LSE from registers.
  __device__ __forceinline__ void stage_and_store(const WorkTile& t, int q_stage, int o_stage, const float (&o)[kOAcc],
                                                  const float (&lse)[2], PendingStore& pending) const {
    const FwdParams& p = params.p;
    const uint32_t epilogue_barrier = barrier_id(NamedBarrier::kEpilogue, warpgroup);
    const Staging to = staging(q_stage, o_stage);
    // Every warp's last wgmma has read the staging's Q rows (or K/V) before anyone overwrites them with O.
    ptx::named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
    // The thread index is re-read here so the staging addresses below are computed per tile
    // rather than hoisted out of the tile loop, where they would take registers the mainloop
    // needs. Unsigned, so the divisions below are shifts and masks.
    const uint32_t thread_now = static_cast<uint32_t>(ptx::thread_index_here()) % kWarpgroupThreads;
    const uint32_t lane_now = thread_now % 32;
    const uint32_t row = Stmatrix::row(thread_now / 32 * 16, lane_now);  // of the slice
    const uint32_t lane_chunk = Stmatrix::lane_chunk(lane_now);
    const uint32_t row_address = ptx::smem_addr(to.base + row * Cfg::kSlabCols);
    Stmatrix::store(row_address, lane_chunk, to.slab_elems, o);
    stamp(TraceEvent::kOWritten);
    const int slice_row = t.first_row + warpgroup * kWarpgroupRows;
    if (p.cu_seqlens_q != nullptr && slice_row + kWarpgroupRows > params.packing.rows(int64_t{t.len_q})) {
      // Generic stores to generic reads: the barrier alone orders them.
      ptx::named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
      store_rows(t, to, slice_row, thread_now);
      ptx::named_barrier_sync(epilogue_barrier, kWarpgroupThreads);  // the staging rows are read
      release_unstored(q_stage, o_stage);
    } else {
      // Ordinary stores -> TMA (async proxy) reads: fence in every writing thread, then meet.
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(epilogue_barrier, kWarpgroupThreads);
      stamp(TraceEvent::kOStaged);
      if (warp == 0 && lane == 0) {
        const int row = t.q_start + params.packing.position(slice_row);
        // A box per slab (the map's dimensions: column, GQA group, row, ...), or one box of every
        // slab where the staging allows it (column, row, slab, ...: make_slab_tensor_map). One
        // loop for both: as an if/else around it, the paired d256 trace build spilled 272 B.
        const bool one_box = kOneBoxStaging && params.o_one_box;
#pragma unroll
        for (int s = 0; s < Cfg::kSlabs; ++s)
          if (s == 0 || !one_box)
            ptx::tma_store_5d(&params.tma_o, to.base + s * to.slab_elems, s * Cfg::kSlabCols, one_box ? row : 0,
                              one_box ? 0 : row, t.head, params.map_batch(t.batch));
        ptx::tma_store_commit();
        stamp(TraceEvent::kOStoreIssued);
        // This thread holds the staging until the store has read it (PendingStore).
        pending.held = true;
        if (in_kv(o_stage)) {
          // The producer refills the stage only for the next tile's second block: give it back
          // now, or behind the next tile's first GEMM issue (Consumer::release_pending).
          if (!params.features.defer_o_read) pending.release_staged_o(smem, o_stage, warpgroup);
        } else {
          // With the next tile's Q in another slot, behind its first GEMM issue (Consumer::qk_alone).
          if (!defers_q_release<Cfg>(params.features, warpgroup)) pending.release(smem, q_stage);
        }
      }
    }

    if (p.lse != nullptr && lane % 4 == 0) {
      // The thread's accumulator rows (ptx/wgmma.cuh): row0 and row0 + 8 of the warp's 16, each a
      // (query head, position) of the packing.
      const int row0 = warpgroup * kWarpgroupRows + static_cast<int>(thread_now / 32 * 16 + lane_now / 4);
      const RowPacking packing = params.packing;
      const int64_t rows = packing.rows(int64_t{t.len_q});
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t row = int64_t{t.first_row} + row0 + 8 * half;
        if (row < rows) p.lse[params.lse_offset(t.batch, packing.query_row(t.head, t.q_start, row))] = lse[half];
      }
    }
  }

  // The slice's rows before its sequence's end (a variable-length batch), copied from the staging
  // in 16-byte chunks of the head_dim columns in use, each row where RowPacking::query_row puts it.
  __device__ __forceinline__ void store_rows(const WorkTile& t, const Staging& from, int slice_row,
                                             uint32_t thread) const {
    const FwdParams& p = params.p;
    const RowPacking packing = params.packing;
    const int rows = static_cast<int>(packing.rows(int64_t{t.len_q})) - slice_row;
    const int chunks = static_cast<int>(p.head_dim) / kSwizzleChunkElems;
    Element* out = static_cast<Element*>(p.o);
    for (int i = static_cast<int>(thread); i < rows * chunks; i += kWarpgroupThreads) {
      const int r = i / chunks, c = i - r * chunks;
      const int swizzled = swizzle_chunk(r, c % kChunksPerSlab);
      const Element* staged = from.base + c / kChunksPerSlab * from.slab_elems + r * Cfg::kSlabCols;
      Element* dst = out + params.o_offset(t.batch, packing.query_row(t.head, t.q_start, slice_row + r));
      *reinterpret_cast<uint4*>(dst + c * kSwizzleChunkElems) =
          *reinterpret_cast<const uint4*>(staged + swizzled * kSwizzleChunkElems);
    }
  }
};

}  // namespace fusedattn::cuda::sm90
