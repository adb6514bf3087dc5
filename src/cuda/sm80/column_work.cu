// The column-masked portable kernels' work per CTA (column_work.h), from the mask's summary.
#include "cuda/sm80/column_work.h"

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"
#include "cuda/common/mask.cuh"
#include "cuda/sm80/bwd_column.cuh"

namespace fusedattn::cuda::sm80 {
namespace {

constexpr int kWarpLanes = 32;
constexpr int kBackwardThreads = 128;

// One warp per (query block, mask head, batch); the lanes split the key blocks of its window.
__global__ void __launch_bounds__(kWarpLanes)
    forward_work_kernel(const __grid_constant__ FwdParams p, ColumnSummary s, int block_m, int block_n, int* work) {
  const int m = static_cast<int>(blockIdx.x), mask_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z), lane = static_cast<int>(threadIdx.x);
  const int r0 = m * block_m, r1 = min(r0 + block_m, static_cast<int>(p.seqlen_q));
  const cuda::BlockRange kv = MaskWindow(p, p.seqlen_q, p.seqlen_k).kv_blocks(r0, r1 - 1, block_n);
  const int64_t entry = (static_cast<int64_t>(batch) * gridDim.y + mask_head) * gridDim.x + m;
  const int4* blocks = s.bounds + (static_cast<int64_t>(batch) * gridDim.y + mask_head) * s.blocks * kColumnSummaryIntervals;
  int seen = 0;
  for (int n = kv.lo + lane; n < kv.hi; n += kWarpLanes)
    seen += column_cover(blocks + n * kColumnSummaryIntervals, r0, r1).seen ? 1 : 0;
  for (int offset = kWarpLanes / 2; offset > 0; offset /= 2) seen += __shfl_xor_sync(0xffffffffu, seen, offset);
  if (lane == 0) work[entry] = seen;
}

// One thread per (KV block, KV head or one for all, batch).
__global__ void __launch_bounds__(kBackwardThreads)
    backward_work_kernel(const __grid_constant__ BwdParams p, ColumnSummary s, WorkItems items, int block_m,
                         int block_n, int* work) {
  const int64_t entry = static_cast<int64_t>(blockIdx.x) * kBackwardThreads + threadIdx.x;
  if (entry >= int64_t{items.blocks} * items.groups * items.batch) return;
  const int n = static_cast<int>(entry % items.blocks);
  const int64_t pair = entry / items.blocks;
  const int kvh = static_cast<int>(pair % items.groups), b = static_cast<int>(pair / items.groups);
  const int group = p.heads_q / p.heads_kv;
  const BlockRange window = query_blocks_of_kv_block(p, n, block_m, block_n, p.seqlen_q, p.seqlen_k);
  const BlockRange m_blocks =
      backward_column_blocks(p, s, b, kvh * group, group, n, window, block_m, static_cast<int>(p.seqlen_q));
  work[entry] = static_cast<int>(m_blocks.end - m_blocks.begin);
}

}  // namespace

int64_t forward_column_work_entries(const FwdParams& p, int block_m) {
  return ceil_div(p.seqlen_q, block_m) * column_mask_heads(p) * p.batch;
}

WorkItems forward_column_work(const FwdParams& p, const ColumnSummary& s, int block_m, int block_n, int* work) {
  const int m_blocks = static_cast<int>(ceil_div(p.seqlen_q, block_m)), groups = column_mask_heads(p);
  if (forward_column_work_entries(p, block_m) > 0 && s.blocks > 0) {
    const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(groups), static_cast<unsigned>(p.batch));
    forward_work_kernel<<<grid, kWarpLanes, 0, static_cast<cudaStream_t>(p.stream)>>>(p, s, block_m, block_n, work);
    FUSEDATTN_CHECK_LAUNCH();
  }
  return {work, m_blocks, groups, p.heads_q / groups, static_cast<int>(p.batch)};
}

int64_t backward_column_work_entries(const BwdParams& p, int block_n) {
  return ceil_div(p.seqlen_k, block_n) * (p.column_mask_per_head ? p.heads_kv : 1) * p.batch;
}

WorkItems backward_column_work(const BwdParams& p, const ColumnSummary& s, int block_m, int block_n, int* work) {
  // A KV head's work is its query heads' union: with one mask head it is the same for every KV head.
  const int groups = p.column_mask_per_head ? p.heads_kv : 1;
  const WorkItems items{work, static_cast<int>(ceil_div(p.seqlen_k, block_n)), groups, p.heads_kv / groups,
                        static_cast<int>(p.batch)};
  const int64_t entries = backward_column_work_entries(p, block_n);
  if (entries > 0) {
    const auto ctas = static_cast<unsigned>(ceil_div(entries, kBackwardThreads));
    backward_work_kernel<<<ctas, kBackwardThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p, s, items, block_m,
                                                                                               block_n, work);
    FUSEDATTN_CHECK_LAUNCH();
  }
  return items;
}

}  // namespace fusedattn::cuda::sm80
