// The parts of a split tile (kernel_params.h, SplitParams) meet here. A consumer warpgroup that
// ran a part of its 64-row slice writes the slice's normalised fp32 O and its LSE to the part's
// workspace slot, then takes a ticket on the slice's counter; the warpgroup that draws the last
// ticket reads every part back and combines them, in part order, so the result does not depend on
// which part finished last (the forward stays bit-identical run to run):
//   m = max_p lse_p,  w_p = exp(lse_p - m),  O = sum_p w_p O_p / sum_p w_p,  lse = m + log(sum_p w_p).
// A row whose LSE is -inf in every part (no key anywhere) gets O = 0 and lse = -inf.
//
// O and LSE go to the workspace in the accumulator's own thread order (each thread's float4
// groups one after another, 128 threads apart), so every store is a coalesced float4. A thread
// whose rows lie past the sequence's end writes nothing. Two ways to combine:
// - A slice of many rows: each thread combines the rows it holds (one dependent L2 round trip per
//   part, its float4s in flight at once) and the epilogue stores them as a whole tile's.
// - A slice of few rows (spreads): a decode step's packed tile has as few rows as the GQA group (4
//   of the slice's 64 for 32 query heads on 8), whose 16 holder threads took a round trip per part
//   (~850 cycles; 6,850 of a 4k-key step's ~24,600 on the H200, docs/hopper.md session 88). There
//   the whole warpgroup combines, each thread a few of one holder's float4 groups, laid out so that
//   a warp's load reads whole runs of the workspace, with the loads of several parts in flight, and
//   writes them straight to O and the LSE; the staging goes unused.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda/atomic>

#include "cuda/common/element.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/named_barriers.h"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/tile_config.h"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/trace.cuh"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg>
struct SplitCombine {
  using Storage = SharedStorage<Element, Cfg>;
  static constexpr int kOAcc = kWarpgroupRows * Cfg::kHeadDim / kWarpgroupThreads;
  static constexpr int kRows = 2;           // accumulator rows per thread: row0 and row0 + 8
  static constexpr int kQuad = 4;           // the lanes of a quad hold one row
  static constexpr int kFloat4s = kOAcc / 4;  // o[4j .. 4j + 3]: both rows' two columns of group j
  // The columns of a float4 group of the accumulator (two of each held by each lane of a quad).
  static constexpr int kChunkCols = kSpreadChunkCols;
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
    // The ticket releases this part's writes and, to the last part, acquires the others': the
    // barrier orders every thread's writes before thread 0's acq_rel add (a release is cumulative),
    // and the barrier after it orders the combine's reads after the add. One thread's fence where
    // each thread's __threadfence (fence.sc.gpu) used to stand, in the combine as well.
    const uint32_t barrier = barrier_id(NamedBarrier::kEpilogue, warpgroup);
    ptx::named_barrier_sync(barrier, kWarpgroupThreads);
    if (thread == 0) {
      ::cuda::atomic_ref<int, ::cuda::thread_scope_device> ticket(
          params.split.tickets[workspace_slot(t) * kMaxConsumerWarpgroups + warpgroup]);
      const bool last = ticket.fetch_add(1, ::cuda::memory_order_acq_rel) == parts_of(t) - 1;
      // Every part of the slice has taken its ticket: the counter starts the next launch at zero.
      if (last) ticket.store(0, ::cuda::memory_order_relaxed);
      smem.split_last[warpgroup] = last ? 1 : 0;
    }
    ptx::named_barrier_sync(barrier, kWarpgroupThreads);
    return smem.split_last[warpgroup] != 0;
  }

  // The last part: every part's O and LSE of this thread's rows combined into o and lse (rows
  // past the sequence's end: 0 and -inf, which the epilogue does not store).
  __device__ __forceinline__ void combine(const WorkTile& t, float (&o)[kOAcc], float (&lse)[kRows],
                                          uint32_t thread) const {
    // The other parts' writes are ordered before these reads by the ticket (write_part); the loads
    // go to L2 (ld.global.cg), where an earlier launch's values cannot linger as in L1.
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
        const float ref = weight_reference(m_new);
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
      inv[r] = inverse_sum(sum[r]);
      lse[r] = combined_lse(m[r], sum[r]);
    }
    rescale_rows(o, inv);
  }

  // Whether the last part combines the slice spread over the warpgroup (combine_spread_and_store):
  // where its rows in use come to at most one chunk a thread, and their holders' float4 groups to
  // at most max_spread_groups a thread (tile_config.h, combine_spreads: the plan's rule too). Else
  // the holders combine their own rows (combine) and the epilogue stores them as a whole tile's.
  __device__ __forceinline__ bool spreads(const WorkTile& t) const {
    return combine_spreads(rows_in_use(t), params.p.head_dim, Cfg::kHeadDim);
  }

  // The last part, a slice of few rows (spreads): the whole warpgroup reads every part's O and LSE
  // of the rows in use and writes the combined rows straight to O and the LSE.
  __device__ __forceinline__ void combine_spread_and_store(const WorkTile& t, float (&buffer)[kOAcc],
                                                           uint32_t thread) const {
    const int rows = rows_in_use(t);
    switch (spread_holders(rows)) {
      case 16: return combine_spread_over<16>(t, buffer, thread, rows);
      case 32: return combine_spread_over<32>(t, buffer, thread, rows);
      case 64: return combine_spread_over<64>(t, buffer, thread, rows);
      default: return combine_spread_over<kWarpgroupThreads>(t, buffer, thread, rows);
    }
  }

 private:
  // The spread combine's reads. The rows' kHolders holder threads (the warpgroup's first ones:
  // row r lies in lanes 4 (r % 8) .. + 3 of warp r / 16) wrote their float4 groups 128 threads
  // apart (write_part), so thread k takes float4 groups k / kHolders + s * (128 / kHolders) of
  // holder k % kHolders: each load instruction of a warp reads runs of 256 bytes or more. Where a
  // thread combined an 8-column chunk of a row instead, each lane's load touched a line of its own
  // (every part's five loads 2 KiB apart): a 4k-key decode step's combine took ~4,400 cycles on the
  // H200, ~3,300 since (docs/hopper.md, session 93).
  static constexpr int kMaxSpreadGroups = max_spread_groups(Cfg::kHeadDim);
  static constexpr int kRoundFloat4s = kFloat4s < 16 ? kFloat4s : 16;  // loads in flight a thread
  static_assert(accumulator_float4s(Cfg::kHeadDim) == kFloat4s, "tile_config.h's spread rule counts these groups");

  // combine_spread_and_store for the rows' kHolders holder threads.
  template <int kHolders>
  __device__ __forceinline__ void combine_spread_over(const WorkTile& t, float (&buffer)[kOAcc], uint32_t thread,
                                                  int rows) const {
    constexpr int kGroups = spread_groups(kHolders, Cfg::kHeadDim);  // float4 groups a thread takes of each part
    if constexpr (kGroups > kMaxSpreadGroups) {
      return;  // spreads() never picks these holders here
    } else {
      constexpr int kGroupStride = kWarpgroupThreads / kHolders;
      // A round's parts' groups go to the buffer, the accumulator's registers, dead once the part
      // is written (separate registers for the loads spilled in the d128 and d256 instances).
      constexpr int kPartsInRound = kRoundFloat4s / kGroups;
      const FwdParams& p = params.p;
      const int holder = static_cast<int>(thread) % kHolders;
      const int first_group = static_cast<int>(thread) / kHolders;
      // The holder's rows: row0 and row0 + 8 of its warp's 16; in a float4 group, row0's two
      // columns come first. A holder of no row in use wrote nothing (write_part).
      const int row0 = holder / 32 * 16 + holder % 32 / kQuad;
      if (row0 >= rows) return;
      const int groups_in_use = p.head_dim / kChunkCols;  // an 8-column group past head_dim is padding
      const int parts = parts_of(t);
      float m[kRows] = {-INFINITY, -INFINITY}, sum[kRows] = {0.f, 0.f}, acc[kGroups][4] = {};
      // No loop with a run-time count here: one (even empty) made ptxas spill 360 B in the d256
      // instances. parts <= kFewRowsMaxParts (fwd_split.h, fwd_work).
#pragma unroll
      for (int q0 = 0; q0 < kFewRowsMaxParts; q0 += kPartsInRound) {
        if (q0 >= parts) break;
        float lse_q[kPartsInRound][kRows];
#pragma unroll
        for (int i = 0; i < kPartsInRound; ++i) {
          const int q = q0 + i;
          if (q >= parts) {
            lse_q[i][0] = lse_q[i][1] = -INFINITY;
            continue;
          }
          const float2 l = __ldcg(lse_slot(t, q, holder));
          lse_q[i][0] = l.x;
          lse_q[i][1] = l.y;
          const float4* in = o_slot(t, q, holder);
#pragma unroll
          for (int s = 0; s < kGroups; ++s) {
            const int j = first_group + s * kGroupStride;
            if (kGroups * kGroupStride > kFloat4s && j >= kFloat4s) break;  // d96: 12 groups, not a multiple
            const float4 v = __ldcg(in + j * kWarpgroupThreads);
            float* b = &buffer[(i * kGroups + s) * 4];
            b[0] = v.x;
            b[1] = v.y;
            b[2] = v.z;
            b[3] = v.w;
          }
        }
        // Trace stamps (trace.cuh; nothing unless compiled in) by thread 0, lane 0 of warp 0.
        if (q0 == 0 && thread == 0)
          FUSEDATTN_SM90_STAMP(params, TraceEvent::kCombineLoadsIssued, warpgroup, -1, 0);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float m_new = m[r];
#pragma unroll
          for (int i = 0; i < kPartsInRound; ++i) m_new = fmaxf(m_new, lse_q[i][r]);
          const float ref = weight_reference(m_new);
          const float scale = expf(m[r] - ref);
          sum[r] *= scale;
#pragma unroll
          for (int s = 0; s < kGroups; ++s) {
            acc[s][2 * r] *= scale;
            acc[s][2 * r + 1] *= scale;
          }
#pragma unroll
          for (int i = 0; i < kPartsInRound; ++i) {
            if (q0 + i >= parts) break;
            const float w = expf(lse_q[i][r] - ref);
            sum[r] += w;
#pragma unroll
            for (int s = 0; s < kGroups; ++s) {
              acc[s][2 * r] = fmaf(w, buffer[(i * kGroups + s) * 4 + 2 * r], acc[s][2 * r]);
              acc[s][2 * r + 1] = fmaf(w, buffer[(i * kGroups + s) * 4 + 2 * r + 1], acc[s][2 * r + 1]);
            }
          }
          m[r] = m_new;
        }
        if (q0 == 0 && thread == 0)
          FUSEDATTN_SM90_STAMP_AFTER(params, TraceEvent::kCombineRoundSummed, warpgroup, acc[0][0]);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = row0 + 8 * r;
        if (row >= rows) continue;
        const float inv = inverse_sum(sum[r]);
        // Row `row` of the slice is (query head, position) of the GQA packing (row_packing.h), where
        // the epilogue's TMA store and LSE write would place it.
        const QueryRow q = params.packing.query_row(t.head, t.q_start, t.first_row + warpgroup * kWarpgroupRows + row);
        Element* out = static_cast<Element*>(p.o) + params.o_offset(t.batch, q) + holder % kQuad * 2;
#pragma unroll
        for (int s = 0; s < kGroups; ++s) {
          const int j = first_group + s * kGroupStride;
          if (j >= groups_in_use) break;
          *reinterpret_cast<uint32_t*>(out + j * kChunkCols) =
              pack2<Element>(acc[s][2 * r] * inv, acc[s][2 * r + 1] * inv);
        }
        if (first_group == 0 && holder % kQuad == 0 && p.lse != nullptr)
          p.lse[params.lse_offset(t.batch, q)] = combined_lse(m[r], sum[r]);
      }
    }
  }

  // The reference the parts' weights exp(lse_p - ref) take from the running maximum m: no key in
  // any part so far makes them exp(-inf) = 0, not exp(-inf + inf) = NaN.
  __device__ __forceinline__ static float weight_reference(float m) { return m == -INFINITY ? 0.f : m; }
  // The combined row from its weights' sum: sum >= 1 where a part saw a key (the largest LSE's
  // weight is 1); no key anywhere gives O = 0 and lse = -inf; NaN stays NaN, in its row.
  __device__ __forceinline__ static float inverse_sum(float sum) { return sum == 0.f ? 0.f : 1.f / sum; }
  __device__ __forceinline__ static float combined_lse(float m, float sum) {
    return sum == 0.f ? -INFINITY : m + logf(sum);
  }

  // The slice's rows before the sequence's end (at least one: empty slices never get here).
  __device__ __forceinline__ int rows_in_use(const WorkTile& t) const {
    const int64_t left = params.packing.rows(int64_t{t.len_q}) - (t.first_row + warpgroup * kWarpgroupRows);
    return left < kWarpgroupRows ? static_cast<int>(left) : kWarpgroupRows;
  }
};

}  // namespace fusedattn::cuda::sm90
