// The work of each CTA of a column-masked portable backward, estimated on the device from the
// mask's summary (common/column_summary.h) before the launch, from which the launch takes its CTA
// order (common/work_order.h; bwd_column_work.cu). The estimate counts blocks by the rule the
// kernel walks by, so an item's rank follows what it will do. (The forwards': common/column_work.h.)
#pragma once

#include <cstdint>

#include "cuda/common/column_summary.h"
#include "cuda/common/work_order.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// Backward (not in deterministic mode, which takes no order): per KV block of block_n keys, the
// query blocks of block_m rows it visits for each query head of its group (bwd_column.cuh's
// backward_column_blocks). One entry per (KV block, KV head or one for all, batch): with one
// mask head every KV head shares it.
int64_t backward_column_work_entries(const BwdParams& p, int block_n);
WorkItems backward_column_work(const BwdParams& p, const ColumnSummary& s, int block_m, int block_n, int* work);

}  // namespace fusedattn::cuda::sm80
