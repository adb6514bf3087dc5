// The query blocks each KV block's keys may be seen from under a column mask, for the backward's
// CTAs (one per KV block): the block's span of rows (common/column_mask.cuh, seen_rows_of_group)
// in query blocks. A CTA leaves the query blocks outside its span out of its loop.
//
// Deterministic mode adds the KV blocks' dQ shares into a query block in increasing block order:
// KV block n waits until the query block's semaphore reads its order n - first, first being the
// window's first KV block of the query block (sm80/bwd_tile_io.cuh, ordered_add_dq). With the
// spans, the blocks below the first that reaches the query block add nothing, so that block's
// turn must be there when the kernel starts: the semaphore starts at it (start_column_turns,
// launched between the workspace's zeroing and the kernel). That needs the blocks adding into one
// query block to be consecutive, as they are where the spans' first and end both grow with the KV
// block (grow(): documents, windows written as columns; a prefix of blocks reaches a query block
// by its first, a suffix by its end, and the window keeps a range of them). Otherwise
// deterministic mode keeps every query block of the window in each CTA's loop, the semaphores at 0.
#pragma once

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/column_mask.cuh"
#include "cuda/common/int_math.h"
#include "cuda/sm80/bwd_mask.h"
#include "cuda/sm80/bwd_workspace.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

template <int kBlockM>
struct ColumnSpans {
  const FwdParams& p;
  const ColumnSummary& summary;
  int batch, head0, heads, len_q;  // the KV head's query heads [head0, head0 + heads)

  // KV block n's query blocks [begin, end): those holding a row that some key of n may be seen by.
  __device__ __forceinline__ BlockRange of(int n) const {
    const RowSpan rows = seen_rows_of_group(p, summary, batch, head0, heads, n, len_q);
    return {rows.first / kBlockM, ceil_div(int64_t{rows.end}, kBlockM)};
  }

  // Whether both ends of the spans grow (never fall) with the KV block, for every mask head of
  // the group: mark_growing_spans' marks (common/column_summary.h), written before the kernel.
  __device__ __forceinline__ bool grow() const {
    bool grows = true;
    for (int h = 0; h < (p.column_mask_per_head ? heads : 1); ++h)
      grows = grows && column_spans_grow(ColumnMaskView::of(p, summary, batch, head0 + h).blocks);
    return grows;
  }
};

// One thread per (query block m, query head h, batch b) of a deterministic column-masked backward
// with kBlockM x kBlockN tiles: where the group's spans grow, m's semaphore starts at the order of
// the first KV block whose span reaches m (binary search: the spans' ends grow with the block).
// Blocks past the window, or a first block whose span starts after m, add nothing: 0 stays.
constexpr int kColumnTurnThreads = 128;

template <int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kColumnTurnThreads) start_column_turns_kernel(BwdParams p, BwdWorkspace ws) {
  const int64_t m = static_cast<int64_t>(blockIdx.x) * kColumnTurnThreads + threadIdx.x;
  const int h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int64_t len_q = p.seqlen_q, len_k = p.seqlen_k;
  if (m * kBlockM >= len_q) return;
  const int group = p.heads_q / p.heads_kv;
  const ColumnSpans<kBlockM> spans{p, ws.columns, b, h / group * group, group, static_cast<int>(len_q)};
  if (!spans.grow()) return;
  const int first = static_cast<int>(first_kv_block_of_query_block(p, m, kBlockM, kBlockN, len_q, len_k));
  int lo = first, hi = static_cast<int>(ceil_div(len_k, kBlockN));  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (spans.of(mid).end > m) hi = mid;
    else lo = mid + 1;
  }
  if (lo * int64_t{kBlockN} >= len_k || spans.of(lo).begin > m) return;
  ws.dq_sem[(ws.row_base(p, b, h) + m * kBlockM) / kBwdSemRows] = lo - first;
}

// Launches it, after mark_growing_spans, on the zeroed semaphores of ws (whose `columns` is the
// launch's summary).
template <int kBlockM, int kBlockN>
void start_column_turns(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream) {
  const int64_t query_blocks = ceil_div(p.seqlen_q, kBlockM);
  if (query_blocks == 0 || ws.dq_sem == nullptr) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(query_blocks, kColumnTurnThreads)), static_cast<unsigned>(p.heads_q),
                  static_cast<unsigned>(p.batch));
  start_column_turns_kernel<kBlockM, kBlockN><<<grid, kColumnTurnThreads, 0, stream>>>(p, ws);
  FUSEDATTN_CHECK_LAUNCH();
}

}  // namespace fusedattn::cuda::sm80
