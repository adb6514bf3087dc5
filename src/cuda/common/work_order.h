// An order of a launch's CTAs by a per-item estimate of their work (longest first within the
// launch's L2 groups), computed on the device before the launch (work_order.cu), for masks whose
// work per item only the device knows.
//
// Why: a column mask (packed documents) makes a query block's work depend on where it lies in its
// document, not on its index, so the grouped order of schedule.h (bottom blocks first) can start
// long items near the end of the launch. Measured (H200, 16k tokens of packed documents,
// docs/perf.md forty-seventh session): while cut blocks were masked key by key, the query blocks
// straddling a document boundary ran long, the portable forward's SMs idled 29% of the kernel
// (ncu) and this order bought 1.40x on mixed documents; since cut blocks inside one document are
// masked from the summary it is even to +4%.
//
// The launch's grid is x = row block, y = head, z = batch, as without an order; CTA number
// x + X * (y + Y * z) takes item order[that number] instead (in the same coding). A persistent
// grid (the Hopper forward) takes its n-th work item from order[n]. Ties keep no
// particular order: each CTA computes its own rows, so results do not depend on it (the
// deterministic backward's ordered adds do, and take no order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/params.h"  // FUSEDATTN_HD

namespace fusedattn::cuda {

// Work of every item, as estimated by the caller. Items come in groups of `copies` heads that
// share one estimate (the heads of one mask head): work[(b * groups + g) * blocks + x] is the work
// of items (x, g * copies + c, b) for every c < copies.
struct WorkItems {
  const int* work;
  int blocks, groups, copies, batch;

  FUSEDATTN_HD int64_t items() const { return int64_t{blocks} * groups * copies * batch; }
};

// Writes order[rank] for rank < items.items(): the CTA number of the rank-th item, on `stream`;
// false (nothing written) for no items or 2^31 or more.
// The items keep the L2 groups of schedule.h: (head, batch) pairs in groups of 2^group_shift
// (pair = head + heads * batch), group by group, and longest first within a group, so the CTAs
// running together still share their group's K/V in L2. (Longest first over every pair at once
// lost the Hopper forward 20-30% on equal documents, H200: docs/hopper.md, session 50.) Work is
// counted in buckets of one block, up to as many as the groups leave of kWorkOrderBuckets; longer
// work counts as the longest bucket.
constexpr int kWorkOrderBuckets = 8192;
bool order_by_work(const WorkItems& items, int group_shift, int* order, cudaStream_t stream);

#ifdef __CUDACC__
// The rank-th item of the order as (block, head, batch), for `blocks` blocks and `heads` heads.
__device__ __forceinline__ uint3 ordered_item(const int* order, unsigned rank, unsigned blocks, unsigned heads) {
  const unsigned item = static_cast<unsigned>(order[rank]);
  const unsigned pair = item / blocks;
  return {item - pair * blocks, pair % heads, pair / heads};
}

// The item a CTA of a grid (x = block, y = head, z = batch) takes: blockIdx through the order,
// or blockIdx itself without one.
__device__ __forceinline__ uint3 ordered_block(const int* order, uint3 block) {
  if (order == nullptr) return block;
  return ordered_item(order, block.x + gridDim.x * (block.y + gridDim.y * block.z), gridDim.x, gridDim.y);
}
#endif

}  // namespace fusedattn::cuda
