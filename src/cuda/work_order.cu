// Longest-first order of a launch's items (common/work_order.h): a counting sort by work in one
// CTA, the work clamped into a bucket per value. The items number a few thousand in the launches
// that order them (query blocks times heads), so one CTA's passes over them cost microseconds.
#include "cuda/common/work_order.h"

#include "cuda/common/check.cuh"

namespace fusedattn::cuda {
namespace {

constexpr int kOrderThreads = 1024;
constexpr int kWarpLanes = 32;
constexpr int kOrderWarps = kOrderThreads / kWarpLanes;
constexpr int kBucketsPerThread = kWorkOrderBuckets / kOrderThreads;
static_assert(kWorkOrderBuckets % kOrderThreads == 0, "each thread scans a whole run of buckets");

__device__ __forceinline__ int bucket_of(int work) {
  return work < 0 ? 0 : (work < kWorkOrderBuckets ? work : kWorkOrderBuckets - 1);
}

// Turns the per-thread totals into exclusive prefix sums over the threads (in thread order).
__device__ int exclusive_scan(int total, int* warp_totals) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpLanes, warp = static_cast<int>(threadIdx.x) / kWarpLanes;
  int inclusive = total;
  for (int offset = 1; offset < kWarpLanes; offset *= 2) {
    const int below = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  if (lane == kWarpLanes - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int warps = warp_totals[lane];  // kOrderWarps == kWarpLanes
    for (int offset = 1; offset < kWarpLanes; offset *= 2) {
      const int below = __shfl_up_sync(0xffffffffu, warps, offset);
      if (lane >= offset) warps += below;
    }
    warp_totals[lane] = warps;
  }
  __syncthreads();
  return inclusive - total + (warp > 0 ? warp_totals[warp - 1] : 0);
}

__global__ void __launch_bounds__(kOrderThreads) order_kernel(WorkItems items, int* order) {
  static_assert(kOrderWarps == kWarpLanes, "the scan's second level is one warp");
  __shared__ int bucket_start[kWorkOrderBuckets];
  __shared__ int warp_totals[kOrderWarps];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t entries = int64_t{items.blocks} * items.groups * items.batch;
  for (int w = tid; w < kWorkOrderBuckets; w += kOrderThreads) bucket_start[w] = 0;
  __syncthreads();
  for (int64_t e = tid; e < entries; e += kOrderThreads) atomicAdd(&bucket_start[bucket_of(items.work[e])], items.copies);
  __syncthreads();
  // Descending work: thread t owns the buckets kWorkOrderBuckets - 1 - (t * kBucketsPerThread + i).
  int counts[kBucketsPerThread], total = 0;
  for (int i = 0; i < kBucketsPerThread; ++i) {
    counts[i] = bucket_start[kWorkOrderBuckets - 1 - (tid * kBucketsPerThread + i)];
    total += counts[i];
  }
  int start = exclusive_scan(total, warp_totals);
  for (int i = 0; i < kBucketsPerThread; ++i) {
    bucket_start[kWorkOrderBuckets - 1 - (tid * kBucketsPerThread + i)] = start;
    start += counts[i];
  }
  __syncthreads();
  const int heads = items.groups * items.copies;
  for (int64_t e = tid; e < entries; e += kOrderThreads) {
    const int x = static_cast<int>(e % items.blocks);
    const int64_t pair = e / items.blocks;  // b * groups + g
    const int g = static_cast<int>(pair % items.groups), b = static_cast<int>(pair / items.groups);
    const int rank = atomicAdd(&bucket_start[bucket_of(items.work[e])], items.copies);
    for (int c = 0; c < items.copies; ++c)
      order[rank + c] = x + items.blocks * (g * items.copies + c + heads * b);
  }
}

}  // namespace

void order_by_work(const WorkItems& items, int* order, cudaStream_t stream) {
  if (items.items() == 0) return;
  order_kernel<<<1, kOrderThreads, 0, stream>>>(items, order);
  FUSEDATTN_CHECK_LAUNCH();
}

}  // namespace fusedattn::cuda
