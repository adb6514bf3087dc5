// The per-key-block summary of a column mask (common/column_summary.h): one warp per (key block,
// mask head, batch) folds its keys' bounds into the least and greatest start and end of each
// interval, and finds the block's runs of keys with equal bounds.
#include "cuda/common/column_summary.h"

#include <climits>

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"

namespace fusedattn::cuda {
namespace {

constexpr int kSummaryThreads = 32;  // one warp per block: its keys are at most a few per lane
constexpr unsigned kAllLanes = 0xffffffffu;

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
      least_start = min(least_start, __shfl_xor_sync(kAllLanes, least_start, offset));
      most_start = max(most_start, __shfl_xor_sync(kAllLanes, most_start, offset));
      least_end = min(least_end, __shfl_xor_sync(kAllLanes, least_end, offset));
      most_end = max(most_end, __shfl_xor_sync(kAllLanes, most_end, offset));
    }
  }
};

// One key's bounds as a run keeps them: an empty interval as (0, 0), so that keys that hide the
// same rows compare equal however their empty intervals are written.
__device__ int4 run_bounds(const int32_t* m, int intervals) {
  static_assert(kColumnSummaryIntervals == 2, "a run's bounds are two intervals");
  int4 v{};
  if (m[0] < m[1]) v.x = m[0], v.y = m[1];
  if (intervals > 1 && m[2] < m[3]) v.z = m[2], v.w = m[3];
  return v;
}

__device__ bool same_bounds(const int4& a, const int4& b) {
  return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w;
}

__device__ int4 shfl_bounds(const int4& v, int lane) {
  return make_int4(__shfl_sync(kAllLanes, v.x, lane), __shfl_sync(kAllLanes, v.y, lane),
                   __shfl_sync(kAllLanes, v.z, lane), __shfl_sync(kAllLanes, v.w, lane));
}

// The runs of one block as lane 0 writes them: each run's bounds as it starts, its end when the
// next one starts (or the block ends). Past kColumnRunsMax runs only the count goes on.
struct Runs {
  int4* record;
  int count = 0;
  uint64_t ends = 0;  // run r's end in byte r: the header's y, then z

  __device__ void end_last(int offset) {
    if (count == 0 || count > kColumnRunsMax) return;
    ends |= static_cast<uint64_t>(offset) << ((count - 1) * kColumnRunEndBits);
  }

  // Warp-collective: the keys of lanes `starts` (a ballot, lowest lane first) begin runs; lane l's
  // key is `offset0 + l` keys after the block's first, its bounds `key`.
  __device__ void start(unsigned starts, int offset0, const int4& key, int lane) {
    while (starts != 0 && count <= kColumnRunsMax) {
      const int l = __ffs(static_cast<int>(starts)) - 1;
      starts &= starts - 1;
      end_last(offset0 + l);
      const int4 bounds = shfl_bounds(key, l);
      if (lane == 0 && count < kColumnRunsMax) record[kColumnRunBounds + count] = bounds;
      ++count;
    }
    count += __popc(starts);  // past kColumnRunsMax: counted only
  }

  __device__ void finish(int block_end) {
    end_last(block_end);
    record[kColumnRunsHeader] =
        make_int4(count <= kColumnRunsMax ? count : 0, static_cast<int>(static_cast<uint32_t>(ends)),
                  static_cast<int>(static_cast<uint32_t>(ends >> 32)), 0);
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
  int4* block = out + ((static_cast<int64_t>(batch) * gridDim.y + mask_head) * gridDim.x + n) * kColumnSummaryStride;
  Bounds b[kColumnSummaryIntervals];
  Runs runs{block};
  int4 before_chunk{};  // the bounds of the key before this chunk's first (none before the block's)
  for (int64_t chunk = first; chunk < end; chunk += kSummaryThreads) {
    const int64_t j = chunk + lane;
    int4 key{};
    if (j < end) {
      const int32_t* m = keys + j * stride.row;
      for (int i = 0; i < intervals; ++i) b[i].add(m[2 * i], m[2 * i + 1]);
      key = run_bounds(m, intervals);
    }
    int4 before = make_int4(__shfl_up_sync(kAllLanes, key.x, 1), __shfl_up_sync(kAllLanes, key.y, 1),
                            __shfl_up_sync(kAllLanes, key.z, 1), __shfl_up_sync(kAllLanes, key.w, 1));
    if (lane == 0) before = before_chunk;
    const bool starts = j < end && (j == first || !same_bounds(key, before));
    runs.start(__ballot_sync(kAllLanes, starts), static_cast<int>(chunk - first), key, lane);
    before_chunk = shfl_bounds(key, kSummaryThreads - 1);
  }
  // A mask of one interval: the second enters as empty (left as it starts, it would hide every row).
  for (int i = intervals; i < kColumnSummaryIntervals; ++i) b[i].add(0, 0);
  for (Bounds& interval : b) interval.add_lanes();
  if (lane != 0) return;
  runs.finish(static_cast<int>(end - first));
  for (int i = 0; i < kColumnSummaryIntervals; ++i)
    block[i] = make_int4(b[i].least_start, b[i].most_start, b[i].least_end, b[i].most_end);
}

constexpr int kSpanThreads = 256;

// One CTA per (mask head, batch): thread t compares blocks t, t + kSpanThreads, .. with their next.
__global__ void __launch_bounds__(kSpanThreads) mark_spans_kernel(int4* bounds, int blocks, int len_q) {
  int4* head = bounds + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * blocks * kColumnSummaryStride;
  const auto span = [&](int n) { return column_seen_rows(head + static_cast<int64_t>(n) * kColumnSummaryStride, len_q); };
  bool grows = true;
  for (int n = static_cast<int>(threadIdx.x); n < blocks; n += kSpanThreads) {
    const RowSpan here = span(n);
    grows = grows && here.first < here.end;
    if (n + 1 < blocks) {
      const RowSpan next = span(n + 1);
      grows = grows && here.first <= next.first && here.end <= next.end;
    }
  }
  const bool all = __syncthreads_and(grows) != 0;
  if (threadIdx.x == 0) head[kColumnRunsHeader].w = all ? 1 : 0;
}

}  // namespace

int64_t column_summary_bytes(const FwdParams& p, int block_keys) {
  return ceil_div(p.seqlen_k, block_keys) * column_mask_heads(p) * p.batch * kColumnSummaryStride *
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

void mark_growing_spans(const FwdParams& p, int4* bounds, int blocks) {
  if (blocks <= 0 || p.batch <= 0) return;
  const dim3 grid(static_cast<unsigned>(column_mask_heads(p)), static_cast<unsigned>(p.batch));
  mark_spans_kernel<<<grid, kSpanThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(bounds, blocks,
                                                                                    static_cast<int>(p.seqlen_q));
  FUSEDATTN_CHECK_LAUNCH();
}

}  // namespace fusedattn::cuda
