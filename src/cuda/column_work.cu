// The forwards' work per query block under a column mask and the scratch holding it
// (common/column_work.h).
#include "cuda/common/column_work.h"

#include "cuda/common/check.cuh"
#include "cuda/common/column_mask.cuh"
#include "cuda/common/env.h"
#include "cuda/common/int_math.h"
#include "cuda/common/mask.cuh"
#include "cuda/common/work_order.h"

namespace fusedattn::cuda {
namespace {

constexpr int kWarpLanes = 32;

// One warp per (query block, mask head, batch); the lanes split the key blocks of its window.
__global__ void __launch_bounds__(kWarpLanes)
    forward_work_kernel(const __grid_constant__ FwdParams p, ColumnSummary s, int block_m, int block_n, int* work) {
  const int m = static_cast<int>(blockIdx.x), mask_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z), lane = static_cast<int>(threadIdx.x);
  const int r0 = m * block_m, r1 = min(r0 + block_m, static_cast<int>(p.seqlen_q));
  const cuda::BlockRange kv = MaskWindow(p, p.seqlen_q, p.seqlen_k).kv_blocks(r0, r1 - 1, block_n);
  const int64_t entry = (static_cast<int64_t>(batch) * gridDim.y + mask_head) * gridDim.x + m;
  // Mask head h is query head h (per-head masks) or 0 (shared), which column_mask_head keeps.
  const ColumnMaskView mask = ColumnMaskView::of(p, s, batch, mask_head);
  int seen = 0;
  for (int n = kv.lo + lane; n < kv.hi; n += kWarpLanes) seen += mask.cover(n, r0, r1).seen ? 1 : 0;
  for (int offset = kWarpLanes / 2; offset > 0; offset /= 2) seen += __shfl_xor_sync(0xffffffffu, seen, offset);
  if (lane == 0) work[entry] = seen;
}

int64_t forward_column_work_entries(const FwdParams& p, int block_m) {
  return ceil_div(p.seqlen_q, block_m) * column_mask_heads(p) * p.batch;
}

// Writes the work per (query block, mask head, batch) into `work` on p.stream; the heads that
// share a mask head share it.
WorkItems forward_column_work(const FwdParams& p, const ColumnSummary& s, int block_m, int block_n, int* work) {
  const int m_blocks = static_cast<int>(ceil_div(p.seqlen_q, block_m)), groups = column_mask_heads(p);
  if (forward_column_work_entries(p, block_m) > 0 && s.blocks > 0) {
    const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(groups), static_cast<unsigned>(p.batch));
    forward_work_kernel<<<grid, kWarpLanes, 0, static_cast<cudaStream_t>(p.stream)>>>(p, s, block_m, block_n, work);
    FUSEDATTN_CHECK_LAUNCH();
  }
  return {work, m_blocks, groups, p.heads_q / groups, static_cast<int>(p.batch)};
}

}  // namespace

ColumnScratch forward_column_scratch(const FwdParams& p, int block_m, int block_n, int64_t resident, int group_shift) {
  const int64_t items = ceil_div(p.seqlen_q, block_m) * p.heads_q * p.batch;
  if (!env_switch_or("FUSEDATTN_COLUMN_ORDER", items > resident)) return ColumnScratch::of(p, block_n);
  ColumnScratch s = ColumnScratch::of(p, block_n, forward_column_work_entries(p, block_m), items);
  // No order without keys (no summary, and no block to visit).
  if (s.order != nullptr && order_by_work(forward_column_work(p, s.summary, block_m, block_n, s.work), group_shift,
                                          s.order, static_cast<cudaStream_t>(p.stream)))
    s.summary.order = s.order;
  return s;
}

}  // namespace fusedattn::cuda
