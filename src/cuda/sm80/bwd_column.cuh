// The backward's query blocks under a column mask: what a KV block's CTA walks (bwd_kernel.cuh),
// and what its work estimate counts (bwd_column_work.cu).
#pragma once

#include <cstdint>

#include "cuda/common/column_mask.cuh"
#include "cuda/common/column_summary.h"
#include "cuda/common/int_math.h"
#include "cuda/sm80/bwd_mask.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// The query blocks KV block n of batch b visits in the backward, for the `group` query heads from
// head0: m_blocks (its window's) less those at the ends of the sequence whose rows every key of
// the block hides from, for every one of the heads (documents: the rows after the block's
// document). The rest it hides are masked element by element.
__device__ __forceinline__ BlockRange backward_column_blocks(const FwdParams& p, const ColumnSummary& s, int b,
                                                             int head0, int group, int n, BlockRange m_blocks,
                                                             int block_m, int len_q) {
  if (m_blocks.empty()) return m_blocks;
  const RowSpan rows = seen_rows_of_group(p, s, b, head0, group, n, len_q);
  const int64_t first = rows.first / block_m, end = ceil_div(int64_t{rows.end}, block_m);
  if (first > m_blocks.begin) m_blocks.begin = first;
  if (end < m_blocks.end) m_blocks.end = end;
  if (m_blocks.end < m_blocks.begin) m_blocks.end = m_blocks.begin;
  return m_blocks;
}

}  // namespace fusedattn::cuda::sm80
