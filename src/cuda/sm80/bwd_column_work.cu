// The column-masked portable backward's work per CTA (bwd_column_work.h), from the mask's summary.
#include "cuda/sm80/bwd_column_work.h"

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"
#include "cuda/sm80/bwd_column.cuh"

namespace fusedattn::cuda::sm80 {
namespace {

constexpr int kBackwardThreads = 128;

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
