// The device check of a variable-length call's offsets and paged table (offsets_check.h): one
// warp per sequence at a time, its lanes over the sequence's pages in use, so a decode batch's
// check costs about one pass over the table entries its keys reach.
#include "cuda/offsets_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"

namespace fusedattn::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kCheckThreads = 256;
constexpr int kCheckWarps = kCheckThreads / kWarpSize;
// CTAs enough to read a decode batch's table entries in parallel; a faulting CTA poisons every
// output alone (the error path need not be fast).
constexpr int kMaxCheckCtas = 256;
constexpr int kMaxTargets = 3;

// The first fault since the host last took it (take_offsets_fault), per device.
__device__ OffsetsFault g_fault;
__device__ int g_fault_claimed;

// One output to poison: rows x heads x cols elements of elem_bytes at the given strides (in
// elements), each set to the bits of a NaN of its type.
struct Target {
  void* base = nullptr;
  int64_t rows = 0, heads = 0, cols = 0;
  int64_t row_stride = 0, head_stride = 0;
  int elem_bytes = 0;
  uint32_t nan_bits = 0;
};
struct Targets {
  Target t[kMaxTargets];
  int count = 0;
};

// A fault's rank within the call, so that the one reported is the one the host check would
// throw (api/validate.cpp): the query offsets' faults, then the keys', by sequence and kind
// (the last entry past the rows after every sequence); then keys past a table row, by sequence;
// then entries outside the pages, by sequence and column.
enum Phase : uint64_t { kQueryOffsets, kKeyOffsets, kTableColumns, kTableEntries };
constexpr int kPhaseShift = 60, kSequenceShift = 28, kKindShift = 24;
constexpr uint64_t kEntryMask = (uint64_t{1} << kKindShift) - 1;
constexpr uint64_t kNoFault = ~uint64_t{0};
__device__ uint64_t rank_of(const OffsetsFault& f, int64_t sequence_rank) {
  const auto kind = static_cast<OffsetsFaultKind>(f.kind);
  const Phase phase = kind == OffsetsFaultKind::kPagesPastTable ? kTableColumns
                      : kind == OffsetsFaultKind::kPageOutside  ? kTableEntries
                      : f.keys                                  ? kKeyOffsets
                                                                : kQueryOffsets;
  const uint64_t entry = f.entry < 0 ? 0 : (uint64_t(f.entry) < kEntryMask ? uint64_t(f.entry) : kEntryMask);
  return (uint64_t{phase} << kPhaseShift) | (uint64_t(sequence_rank) << kSequenceShift) |
         (uint64_t(f.kind) << kKindShift) | entry;
}

struct Local {
  uint64_t rank = kNoFault;
  OffsetsFault fault;
  // sequence_rank: where the host check meets the fault (the sequence, or the batch size for the
  // last entry, which it checks after every sequence).
  __device__ void note(OffsetsFaultKind kind, int keys, int64_t sequence, int64_t entry, int64_t value, int64_t bound,
                       int64_t detail = 0, int64_t sequence_rank = -1) {
    const OffsetsFault f{static_cast<int32_t>(kind), keys, sequence, entry, value, bound, detail};
    const uint64_t r = rank_of(f, sequence_rank < 0 ? sequence : sequence_rank);
    if (r < rank) {
      rank = r;
      fault = f;
    }
  }
};

// Sequence b's offsets on one side: the host check's rules (api/validate.cpp). Non-decreasing
// offsets whose last entry is within the rows keep every sequence within them. rows < 0: no packed
// tensor bounds them (paged keys).
__device__ void check_sequence(const int32_t* cu, int keys, int b, int batch, int64_t rows, int64_t max_len,
                               Local& local) {
  const int64_t start = cu[b], end = cu[b + 1];
  if (b == 0 && start != 0) local.note(OffsetsFaultKind::kFirstNotZero, keys, b, 0, start, 0);
  if (end < start) local.note(OffsetsFaultKind::kDecreasing, keys, b, b + 1, end, start);
  if (end - start > max_len) local.note(OffsetsFaultKind::kTooLong, keys, b, b + 1, end - start, max_len);
  if (b == batch - 1 && rows >= 0 && end > rows)
    local.note(OffsetsFaultKind::kPastRows, keys, b, b + 1, end, rows, 0, /*sequence_rank=*/batch);
}

// Sequence b's table entries in use (its used keys' pages), by the warp's lanes.
__device__ void check_pages(const FwdParams& p, int b, int lane, Local& local) {
  const int64_t rows = p.cu_seqlens_k[b + 1] - int64_t{p.cu_seqlens_k[b]};
  const int64_t used = used_keys(p, b, rows < 0 ? 0 : rows);
  const int64_t pages = ceil_div(used, p.page_size);
  if (pages > p.block_table_cols && lane == 0)
    local.note(OffsetsFaultKind::kPagesPastTable, 1, b, 0, used, p.block_table_cols, p.page_size);
  const int64_t in_use = pages < p.block_table_cols ? pages : p.block_table_cols;
  for (int64_t j = lane; j < in_use; j += kWarpSize) {
    const int64_t page = p.block_table[b * p.block_table_stride + j];
    if (page < 0 || page >= p.num_pages) local.note(OffsetsFaultKind::kPageOutside, 1, b, j, page, p.num_pages);
  }
}

__device__ void poison(const Targets& targets) {
  for (int i = 0; i < targets.count; ++i) {
    const Target& t = targets.t[i];
    const int64_t n = t.rows * t.heads * t.cols;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      const int64_t c = e % t.cols, h = e / t.cols % t.heads, r = e / (t.cols * t.heads);
      const int64_t at = r * t.row_stride + h * t.head_stride + c;
      if (t.elem_bytes == sizeof(uint16_t))
        static_cast<uint16_t*>(t.base)[at] = static_cast<uint16_t>(t.nan_bits);
      else
        static_cast<uint32_t*>(t.base)[at] = t.nan_bits;
    }
  }
}

__global__ void __launch_bounds__(kCheckThreads) check_offsets_kernel(const FwdParams p, const Targets targets) {
  __shared__ unsigned long long best;
  __shared__ int reported;
  if (threadIdx.x == 0) {
    best = kNoFault;
    reported = 0;
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarpSize;
  const bool paged = p.block_table != nullptr;
  Local local;
  for (int b = blockIdx.x * kCheckWarps + threadIdx.x / kWarpSize; b < p.batch; b += gridDim.x * kCheckWarps) {
    if (lane == 0) check_sequence(p.cu_seqlens_q, 0, b, p.batch, p.varlen_rows_q, p.seqlen_q, local);
    if (lane == 1) check_sequence(p.cu_seqlens_k, 1, b, p.batch, paged ? -1 : p.varlen_rows_k, p.seqlen_k, local);
    if (paged) check_pages(p, b, lane, local);
  }
  if (local.rank != kNoFault) atomicMin(&best, local.rank);
  __syncthreads();
  if (best == kNoFault) return;
  if (local.rank == best && atomicCAS(&reported, 0, 1) == 0 && atomicCAS(&g_fault_claimed, 0, 1) == 0) {
    g_fault = local.fault;
    __threadfence();
  }
  poison(targets);
}

// NaN bits per element type: fp16 0x7E00, bf16 0x7FC0, fp32 0x7FC00000.
constexpr uint32_t kHalfNaN = 0x7E00, kBf16NaN = 0x7FC0, kFloatNaN = 0x7FC00000;
Target element_target(void* base, DType dtype, int64_t rows, int heads, int cols, const OperandStrides& s) {
  const bool bf16 = dtype == DType::kBFloat16, fp32 = dtype == DType::kFloat32;
  return {base, rows, heads, cols, s.row, s.head, fp32 ? 4 : 2, fp32 ? kFloatNaN : (bf16 ? kBf16NaN : kHalfNaN)};
}

void launch(const FwdParams& p, const Targets& targets) {
  const int ctas = static_cast<int>(std::min<int64_t>(ceil_div(int64_t{p.batch}, int64_t{kCheckWarps}), kMaxCheckCtas));
  if (ctas == 0) return;
  check_offsets_kernel<<<ctas, kCheckThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p, targets);
  FUSEDATTN_CHECK_LAUNCH();
}

}  // namespace

void check_offsets_on_device(const FwdParams& p) {
  Targets targets;
  targets.t[targets.count++] = element_target(p.o, p.dtype, p.varlen_rows_q, p.heads_q, p.head_dim, p.o_stride);
  // lse [heads, rows]: a head's rows are contiguous.
  if (p.lse != nullptr)
    targets.t[targets.count++] = {p.lse, p.heads_q, 1, p.varlen_rows_q, p.lse_head_stride, 0, 4, kFloatNaN};
  launch(p, targets);
}

void check_offsets_on_device(const BwdParams& p) {
  Targets targets;
  targets.t[targets.count++] = element_target(p.dq, p.dtype, p.varlen_rows_q, p.heads_q, p.head_dim, p.dq_stride);
  targets.t[targets.count++] = element_target(p.dk, p.dtype, p.varlen_rows_k, p.heads_kv, p.head_dim, p.dk_stride);
  targets.t[targets.count++] = element_target(p.dv, p.dtype, p.varlen_rows_k, p.heads_kv, p.head_dim, p.dv_stride);
  launch(p, targets);
}

bool take_offsets_fault(OffsetsFault& fault) {
  int claimed = 0;
  FUSEDATTN_CUDA_CHECK(cudaMemcpyFromSymbol(&claimed, g_fault_claimed, sizeof(claimed)));
  if (claimed == 0) return false;
  FUSEDATTN_CUDA_CHECK(cudaMemcpyFromSymbol(&fault, g_fault, sizeof(fault)));
  const int cleared = 0;
  FUSEDATTN_CUDA_CHECK(cudaMemcpyToSymbol(g_fault_claimed, &cleared, sizeof(cleared)));
  return true;
}

}  // namespace fusedattn::cuda
