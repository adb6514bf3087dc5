// The second kernel of a split portable forward (fwd_kv_split.h): one warp per (query row, head)
// weighs the row's O in every part by its LSE, in part order, and writes the row's O in the output
// dtype and its LSE; and the split's plan and workspace.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"
#include "cuda/common/element.cuh"
#include "cuda/common/env.h"
#include "cuda/common/int_math.h"
#include "cuda/common/stream_buffer.h"
#include "cuda/sm80/fwd_kv_split.h"
#include "cuda/sm80/tile_config.h"
#include "fusedattn/error.h"

namespace fusedattn::cuda::sm80 {

namespace {

constexpr int kCombineWarps = 4;
// A lane takes column pairs 2 * lane, 2 * lane + 64, ... (head dims are multiples of 8).
constexpr int kPairCols = 2;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxPairsPerLane = kMaxHeadDim / (kPairCols * kWarpSize);

template <typename Element>
__global__ void __launch_bounds__(kCombineWarps* kWarpSize)
    combine_kernel(const __grid_constant__ FwdParams p, const KvSplit split) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = int64_t{blockIdx.x} * kCombineWarps + threadIdx.x / kWarpSize;
  const int head = static_cast<int>(blockIdx.y);
  if (row >= split.rows) return;

  float m = -INFINITY;
  for (int part = 0; part < split.parts; ++part) m = fmaxf(m, split.lse[split.slot(part, head, row)]);
  // No key in any part: the weights become exp(-inf) = 0, not exp(-inf + inf) = NaN.
  const float ref = m == -INFINITY ? 0.f : m;
  float2 acc[kMaxPairsPerLane] = {};
  float sum = 0.f;
  for (int part = 0; part < split.parts; ++part) {
    const int64_t slot = split.slot(part, head, row);
    const float w = expf(split.lse[slot] - ref);
    sum += w;
    const float* o = split.o + slot * split.o_cols;
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int col = kPairCols * (lane + j * kWarpSize);
      if (col >= p.head_dim) break;
      const float2 v = *reinterpret_cast<const float2*>(o + col);
      acc[j].x = fmaf(w, v.x, acc[j].x);
      acc[j].y = fmaf(w, v.y, acc[j].y);
    }
  }
  // sum >= 1 where a part saw a key (its own weight is 1).
  const bool empty = sum == 0.f;
  const float inv = empty ? 0.f : 1.f / sum;

  // The kernel's workspace row (fwd_kernel.cuh): batch * seqlen_q + i for dense batches, the
  // sequence's first packed row times view_group plus i for variable-length ones.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t per = varlen ? p.view_group : p.seqlen_q;
  const int64_t first = row / per, i = row % per;
  const int64_t batch = varlen ? 0 : first, q_start = varlen ? first : 0;
  Element* out = static_cast<Element*>(p.o) + batch * p.o_stride.batch + o_row_offset(p, q_start, i) +
                 head * p.o_stride.head;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int col = kPairCols * (lane + j * kWarpSize);
    if (col >= p.head_dim) break;
    *reinterpret_cast<uint32_t*>(out + col) = pack2<Element>(acc[j].x * inv, acc[j].y * inv);
  }
  if (p.lse != nullptr && lane == 0)
    p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + lse_row_offset(p, q_start, i)] =
        empty ? -INFINITY : ref + logf(sum);
}

}  // namespace

int kv_split_parts_for(const FwdParams& p, int block_m, int ctas_per_sm) {
  if (!env_switch_or("FUSEDATTN_SM80_KV_SPLIT", true)) return 1;
  const int64_t ctas = ceil_div(p.seqlen_q, int64_t{block_m}) * p.heads_q * p.batch;
  const int64_t slots = int64_t{current_device_attribute(cudaDevAttrMultiProcessorCount)} * ctas_per_sm;
  return kv_split_parts(ctas, p.seqlen_k, slots);
}

KvSplit plan_kv_split(const FwdParams& p, int block_m, int ctas_per_sm, int o_cols) {
  KvSplit split;
  split.parts = kv_split_parts_for(p, block_m, ctas_per_sm);
  if (split.parts == 1) return {};
  split.heads = p.heads_q;
  split.rows = p.cu_seqlens_q != nullptr ? p.varlen_rows_q * p.view_group : p.batch * p.seqlen_q;
  split.o_cols = o_cols;

  constexpr int64_t kAlignFloats = 32;  // O rows start 128 bytes in (float2 stores)
  const int64_t slots_used = int64_t{split.parts} * split.heads * split.rows;
  const int64_t lse_floats = round_up(slots_used, kAlignFloats);
  const int64_t bytes = (lse_floats + slots_used * split.o_cols) * int64_t{sizeof(float)};
  const StreamBuffer buf = stream_buffer(StreamBufferUser::kSm80KvSplit, static_cast<cudaStream_t>(p.stream), bytes);
  if (buf.base == nullptr) return {};
  float* const base = reinterpret_cast<float*>(buf.base);
  split.lse = base;
  split.o = base + lse_floats;
  return split;
}

void combine_kv_split(const FwdParams& p, const KvSplit& split) {
  if (p.head_dim > kMaxHeadDim || p.head_dim % kPairCols != 0)
    throw Error(ErrorCode::kUnsupported, "head_dim", "the split forward's combine takes even head dims up to 256");
  const dim3 grid(static_cast<unsigned>(ceil_div(split.rows, int64_t{kCombineWarps})),
                  static_cast<unsigned>(split.heads));
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.dtype == DType::kFloat16)
    combine_kernel<__half><<<grid, kCombineWarps * kWarpSize, 0, stream>>>(p, split);
  else
    combine_kernel<__nv_bfloat16><<<grid, kCombineWarps * kWarpSize, 0, stream>>>(p, split);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusedattn::cuda::sm80
