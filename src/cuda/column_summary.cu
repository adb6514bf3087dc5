// The per-key-block summary of a column mask (common/column_summary.h): one warp per (key block,
// mask head, batch) folds its keys' bounds into the least and greatest start and end of each
// interval.
#include "cuda/common/column_summary.h"

#include <climits>

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"

namespace fusedattn::cuda {
namespace {

constexpr int kSummaryThreads = 32;  // one warp per block: its keys are at most a few per lane

struct Bounds {
  int least_start = INT_MAX, most_start = INT_MIN, least_end = INT_MAX, most_end = INT_MIN;

  __device__ void add(int start, int end) {
    if (start >= end) {  // hides nothing: must neither hide nor cut a block (column_mask.cuh)
      start = INT_MAX;
      end = INT_MIN;
    }
    least_start = min(least_start, start);
    most_start = max(most_start, start);
    least_end = min(least_end, end);
    most_end = max(most_end, end);
  }

  __device__ void add_lanes() {
    for (int offset = kSummaryThreads / 2; offset > 0; offset /= 2) {
      least_start = min(least_start, __shfl_xor_sync(0xffffffffu, least_start, offset));
      most_start = max(most_start, __shfl_xor_sync(0xffffffffu, most_start, offset));
      least_end = min(least_end, __shfl_xor_sync(0xffffffffu, least_end, offset));
      most_end = max(most_end, __shfl_xor_sync(0xffffffffu, most_end, offset));
    }
  }
};

__global__ void __launch_bounds__(kSummaryThreads)
    summarize_kernel(const int32_t* mask, OperandStrides stride, int intervals, int64_t len_k, int block_keys,
                     int4* out) {
  const int n = static_cast<int>(blockIdx.x), mask_head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z), lane = static_cast<int>(threadIdx.x);
  const int32_t* keys = mask + batch * stride.batch + mask_head * stride.head;
  const int64_t first = static_cast<int64_t>(n) * block_keys;
  const int64_t end = first + block_keys < len_k ? first + block_keys : len_k;
  Bounds b[kColumnSummaryIntervals];
  for (int64_t j = first + lane; j < end; j += kSummaryThreads) {
    const int32_t* m = keys + j * stride.row;
    for (int i = 0; i < intervals; ++i) b[i].add(m[2 * i], m[2 * i + 1]);
  }
  // A mask of one interval: the second enters as empty (left as it starts, it would hide every row).
  for (int i = intervals; i < kColumnSummaryIntervals; ++i) b[i].add(0, 0);
  for (Bounds& interval : b) interval.add_lanes();
  if (lane != 0) return;
  int4* block = out + ((static_cast<int64_t>(batch) * gridDim.y + mask_head) * gridDim.x + n) * kColumnSummaryIntervals;
  for (int i = 0; i < kColumnSummaryIntervals; ++i)
    block[i] = make_int4(b[i].least_start, b[i].most_start, b[i].least_end, b[i].most_end);
}

}  // namespace

int64_t column_summary_bytes(const FwdParams& p, int block_keys) {
  return ceil_div(p.seqlen_k, block_keys) * column_mask_heads(p) * p.batch * kColumnSummaryIntervals *
         static_cast<int64_t>(sizeof(int4));
}

ColumnSummary summarize_column_mask(const FwdParams& p, int block_keys, int4* bounds) {
  const int blocks = static_cast<int>(ceil_div(p.seqlen_k, block_keys));
  if (blocks > 0 && p.batch > 0) {
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(column_mask_heads(p)),
                    static_cast<unsigned>(p.batch));
    summarize_kernel<<<grid, kSummaryThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(
        p.column_mask, p.column_mask_stride, p.column_mask_intervals, p.seqlen_k, block_keys, bounds);
    FUSEDATTN_CHECK_LAUNCH();
  }
  return {bounds, blocks};
}

}  // namespace fusedattn::cuda
