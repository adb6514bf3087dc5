// The parts of a split tile (kernel_params.h, SplitParams) meet here. A consumer warpgroup that
// ran a part of its 64-row slice writes the slice's normalised fp32 O and its LSE to the part's
// workspace slot, then takes a ticket on the slice's counter; the warpgroup that draws the last
// ticket reads every part back and combines them, in part order, so the result does not depend on
// which part finished last (the forward stays bit-identical run to run):
//   m = max_p lse_p,  w_p = exp(lse_p - m),  O = sum_p w_p O_p / sum_p w_p,  lse = m + log(sum_p w_p),
// in one pass over the parts, the sums rescaled as the running maximum grows.
// A row whose LSE is -inf in every part (no key anywhere) gets O = 0 and lse = -inf. That
// warpgroup then stores O through the ordinary epilogue; the others store nothing.
//
// O and LSE go to the workspace in the accumulator's own thread order (each thread's float4
// groups one after another, 128 threads apart), so every store and load is a coalesced float4 and
// the combining warpgroup reads exactly the values its threads hold the rows of. A thread whose
// rows lie past the sequence's end writes and reads nothing: a decode step's packed tile has as
// few rows as the GQA group (4 of the slice's 64 for 32 query heads on 8), and the combine, one
// dependent L2 round trip per part, is on the critical path of every split launch.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/named_barriers.h"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/tile_scheduler.cuh"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg>
struct SplitCombine {
  using Storage = SharedStorage<Element, Cfg>;
  static constexpr int kOAcc = kWarpgroupRows * Cfg::kHeadDim / kWarpgroupThreads;
  static constexpr int kRows = 2;           // accumulator rows per thread: row0 and row0 + 8
  static constexpr int kQuad = 4;           // the lanes of a quad hold one row
  static constexpr int kFloat4s = kOAcc / 4;  // o[4j .. 4j + 3]: both rows' two columns of group j
  // A part's slot: the tile's block_m rows of O (Cfg::kHeadDim floats each) and LSE.
  static constexpr int64_t kSlotO = int64_t{Cfg::kBlockM} * Cfg::kHeadDim;
  static constexpr int kSlotLse = Cfg::kBlockM;
  // Per warpgroup, a quad's two rows are one float2 of LSE: 32 quads, 64 rows.
  static constexpr int kQuadsPerWarpgroup = kWarpgroupThreads / kQuad;

  const KernelParams& params;
  Storage& smem;
  int warpgroup;

  __device__ __forceinline__ int parts_of(const WorkTile& t) const { return params.split.plan.parts_of(t.slot); }

  // t's slot in the workspace: its tail item's, or in a cluster (whose item is a pair of query
  // blocks, TileScheduler) one per CTA, kClusterCtas x the item + the CTA's rank.
  __device__ __forceinline__ int workspace_slot(const WorkTile& t) const {
    if constexpr (Cfg::kClusterCtas == 1) return t.slot;
    else return t.slot * Cfg::kClusterCtas + static_cast<int>(ptx::cluster_ctarank());
  }

  __device__ __forceinline__ float4* o_slot(const WorkTile& t, int part, uint32_t thread) const {
    const int64_t slot = int64_t{workspace_slot(t)} * params.split.plan.max_parts + part;
    return reinterpret_cast<float4*>(params.split.o + slot * kSlotO) + warpgroup * kWarpgroupThreads * kFloat4s +
           thread;
  }
  // Whether row0 of this thread's two accumulator rows (row0, row0 + 8; ptx/wgmma.cuh) holds a
  // query: if not, neither does row0 + 8, and the epilogue stores neither.
  __device__ __forceinline__ bool holds_rows(const WorkTile& t, uint32_t thread) const {
    const int row0 = t.first_row + warpgroup * kWarpgroupRows + static_cast<int>(thread / 32 * 16 + thread % 32 / kQuad);
    return row0 < params.packing.rows(int64_t{t.len_q});
  }

  __device__ __forceinline__ float2* lse_slot(const WorkTile& t, int part, uint32_t thread) const {
    const int64_t slot = int64_t{workspace_slot(t)} * params.split.plan.max_parts + part;
    return reinterpret_cast<float2*>(params.split.lse + slot * kSlotLse) + warpgroup * kQuadsPerWarpgroup +
           thread / kQuad;
  }

  // Writes this part's normalised O and LSE; returns whether this warpgroup drew the slice's last
  // ticket (uniform over the warpgroup) and must combine. `thread`: index in the warpgroup.
  __device__ __forceinline__ bool write_part(const WorkTile& t, const float (&o)[kOAcc], const float (&lse)[kRows],
                                             uint32_t thread) const {
    if (holds_rows(t, thread)) {
      float4* o_out = o_slot(t, t.part, thread);
#pragma unroll
      for (int j = 0; j < kFloat4s; ++j)
        o_out[j * kWarpgroupThreads] = {o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]};
      if (thread % kQuad == 0) *lse_slot(t, t.part, thread) = {lse[0], lse[1]};
    }
    // Each thread's writes are visible GPU-wide before the warpgroup's ticket says they are done.
    __threadfence();
    const uint32_t barrier = barrier_id(NamedBarrier::kEpilogue, warpgroup);
    ptx::named_barrier_sync(barrier, kWarpgroupThreads);
    if (thread == 0) {
      int* ticket = &params.split.tickets[workspace_slot(t) * kMaxConsumerWarpgroups + warpgroup];
      const bool last = atomicAdd(ticket, 1) == parts_of(t) - 1;
      // Every part of the slice has taken its ticket: the counter starts the next launch at zero.
      if (last) atomicExch(ticket, 0);
      smem.split_last[warpgroup] = last ? 1 : 0;
    }
    ptx::named_barrier_sync(barrier, kWarpgroupThreads);
    return smem.split_last[warpgroup] != 0;
  }

  // The last part: every part's O and LSE of this thread's rows combined into o and lse (rows
  // past the sequence's end: 0 and -inf, which the epilogue does not store).
  __device__ __forceinline__ void combine(const WorkTile& t, float (&o)[kOAcc], float (&lse)[kRows],
                                          uint32_t thread) const {
    // Orders the other parts' writes (seen through the ticket) before the reads below; the loads
    // go to L2 (ld.global.cg), where an earlier launch's values cannot linger as in L1.
    __threadfence();
    const int parts = holds_rows(t, thread) ? parts_of(t) : 0;
    // One pass, the maximum kept as it goes (as the mainloop's online softmax), each part's LSE
    // read with its O. Not for speed (session 86's trace: the first pass's loads had overlapped,
    // the combine stayed ~7,300 cycles of a 4k-key decode step's ~24,600, one L2 round trip per
    // part): with holds_rows, the two-pass form spilled 8-124 B in the d256 pair, quad and n80
    // instances, this one none.
    float m[kRows] = {-INFINITY, -INFINITY}, sum[kRows] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kOAcc; ++i) o[i] = 0.f;
    for (int q = 0; q < parts; ++q) {
      const float2 l = __ldcg(lse_slot(t, q, thread));
      const float lse_q[kRows] = {l.x, l.y};
      float w[kRows], scale[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float m_new = fmaxf(m[r], lse_q[r]);
        // No key in any part so far: the weights become exp(-inf) = 0, not exp(-inf + inf) = NaN.
        const float ref = m_new == -INFINITY ? 0.f : m_new;
        scale[r] = expf(m[r] - ref);
        w[r] = expf(lse_q[r] - ref);
        sum[r] = fmaf(sum[r], scale[r], w[r]);
        m[r] = m_new;
      }
      const float4* o_in = o_slot(t, q, thread);
#pragma unroll
      for (int j = 0; j < kFloat4s; ++j) {
        const float4 v = __ldcg(o_in + j * kWarpgroupThreads);
        o[4 * j] = fmaf(w[0], v.x, o[4 * j] * scale[0]);
        o[4 * j + 1] = fmaf(w[0], v.y, o[4 * j + 1] * scale[0]);
        o[4 * j + 2] = fmaf(w[1], v.z, o[4 * j + 2] * scale[1]);
        o[4 * j + 3] = fmaf(w[1], v.w, o[4 * j + 3] * scale[1]);
      }
    }
    float inv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // sum >= 1 where a part saw a key (the largest LSE's weight is 1); NaN stays NaN, in its row.
      const bool empty = sum[r] == 0.f;
      inv[r] = empty ? 0.f : 1.f / sum[r];
      lse[r] = empty ? -INFINITY : m[r] + logf(sum[r]);
    }
    rescale_rows(o, inv);
  }
};

}  // namespace fusedattn::cuda::sm90
