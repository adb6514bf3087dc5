// A column-masked forward's scratch (common/column_scratch.h) with, where its launch has more
// work items than the GPU runs at once, the items' order by their work (common/work_order.h), for
// both forwards (sm80/fwd_launch.cuh, sm90/fwd_launch.cuh). Under a column mask a query block's
// work follows its place in its document, not its index, so the grid's own longest-first order
// (schedule.h) leaves the SMs idle at the launch's end.
//
// The work of a query block of block_m rows is the key blocks (of block_n keys) it visits: those
// of its window's range that some row of the block sees (column_mask.cuh's rule, counted on the
// device from the summary before the launch). FUSEDATTN_COLUMN_ORDER=1 orders every launch, =0
// none (tests, A/B measurements).
#pragma once

#include <cstdint>

#include "cuda/common/column_scratch.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

// resident: how many of the launch's CTAs run at once (a persistent grid's size); group_shift:
// the launch's L2 groups of (head, batch) pairs (schedule.h), which the order keeps. The items are
// the (query block, head, batch) triples; order[rank] codes the rank-th as
// block + blocks * (head + heads * batch).
ColumnScratch forward_column_scratch(const FwdParams& p, int block_m, int block_n, int64_t resident,
                                     int group_shift);

}  // namespace fusedattn::cuda
