// The order of a launch's items by work within their L2 groups (common/work_order.h): a counting
// sort in one CTA, by (group, work) buckets. The items number a few thousand in the launches that
// order them (query or key blocks times heads), so one CTA's passes over them cost microseconds.
#include "cuda/common/work_order.h"

#include <limits>

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"

namespace fusedattn::cuda {
namespace {

constexpr int kOrderThreads = 1024;
constexpr int kWarpLanes = 32;
constexpr int kOrderWarps = kOrderThreads / kWarpLanes;
constexpr int kBucketsPerThread = kWorkOrderBuckets / kOrderThreads;
static_assert(kWorkOrderBuckets % kOrderThreads == 0, "each thread scans a whole run of buckets");

// Turns the per-thread totals into exclusive prefix sums over the threads (in thread order).
__device__ int exclusive_scan(int total, int* warp_totals) {
  static_assert(kOrderWarps == kWarpLanes, "the scan's second level is one warp");
  const int lane = static_cast<int>(threadIdx.x) % kWarpLanes, warp = static_cast<int>(threadIdx.x) / kWarpLanes;
  int inclusive = total;
  for (int offset = 1; offset < kWarpLanes; offset *= 2) {
    const int below = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  if (lane == kWarpLanes - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int warps = warp_totals[lane];
    for (int offset = 1; offset < kWarpLanes; offset *= 2) {
      const int below = __shfl_up_sync(0xffffffffu, warps, offset);
      if (lane >= offset) warps += below;
    }
    warp_totals[lane] = warps;
  }
  __syncthreads();
  return inclusive - total + (warp > 0 ? warp_totals[warp - 1] : 0);
}

// Item i (the CTA number x + blocks * pair) goes to bucket group * span + (span - 1 - work): the
// buckets in ascending order are the items' order.
struct Buckets {
  WorkItems items;
  int group_shift, span;

  // 32-bit: order_by_work takes fewer than 2^31 items.
  __device__ int of(int i) const {
    const int pair = i / items.blocks, x = i - pair * items.blocks;
    const int heads = items.groups * items.copies;
    const int b = pair / heads, head = pair - b * heads;
    const int work = items.work[(b * items.groups + head / items.copies) * items.blocks + x];
    const int group = pair >> group_shift;
    const int most = span - 1, clamped = work < 0 ? 0 : (work < most ? work : most);
    const int bucket = group < kWorkOrderBuckets / span ? group * span + (most - clamped) : kWorkOrderBuckets - 1;
    return bucket;
  }
};

__global__ void __launch_bounds__(kOrderThreads) order_kernel(Buckets buckets, int* order) {
  __shared__ int bucket_start[kWorkOrderBuckets];
  __shared__ int warp_totals[kOrderWarps];
  const int tid = static_cast<int>(threadIdx.x);
  const int items = static_cast<int>(buckets.items.items());
  for (int w = tid; w < kWorkOrderBuckets; w += kOrderThreads) bucket_start[w] = 0;
  __syncthreads();
  for (int i = tid; i < items; i += kOrderThreads) atomicAdd(&bucket_start[buckets.of(i)], 1);
  __syncthreads();
  // Thread t owns buckets [t * kBucketsPerThread, (t + 1) * kBucketsPerThread).
  int counts[kBucketsPerThread], total = 0;
#pragma unroll
  for (int j = 0; j < kBucketsPerThread; ++j) {
    counts[j] = bucket_start[tid * kBucketsPerThread + j];
    total += counts[j];
  }
  int start = exclusive_scan(total, warp_totals);
#pragma unroll
  for (int j = 0; j < kBucketsPerThread; ++j) {
    bucket_start[tid * kBucketsPerThread + j] = start;
    start += counts[j];
  }
  __syncthreads();
  for (int i = tid; i < items; i += kOrderThreads) order[atomicAdd(&bucket_start[buckets.of(i)], 1)] = i;
}

}  // namespace

bool order_by_work(const WorkItems& items, int group_shift, int* order, cudaStream_t stream) {
  if (items.items() == 0 || items.items() > std::numeric_limits<int>::max()) return false;
  const int64_t pairs = int64_t{items.groups} * items.copies * items.batch;
  const int64_t groups = ceil_div(pairs, int64_t{1} << group_shift);
  const int span = groups < kWorkOrderBuckets ? static_cast<int>(kWorkOrderBuckets / groups) : 1;
  order_kernel<<<1, kOrderThreads, 0, stream>>>(Buckets{items, group_shift, span}, order);
  FUSEDATTN_CHECK_LAUNCH();
  return true;
}

}  // namespace fusedattn::cuda
