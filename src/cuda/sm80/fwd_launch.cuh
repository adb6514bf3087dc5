// Host launcher of the sm80 forward kernel: grid, shared-memory opt-in, stream.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/column_summary.h"
#include "cuda/common/device.h"
#include "cuda/common/int_math.h"
#include "cuda/common/schedule.h"
#include "cuda/common/stream_buffer.h"
#include "cuda/common/env.h"
#include "cuda/common/work_order.h"
#include "cuda/sm80/column_work.h"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/sm80/fwd_kv_split.h"
#include "fusedattn/error.h"

namespace fusedattn::cuda::sm80 {

// Without opting in, a block may use at most 48 KiB of dynamic shared memory.
constexpr int kDefaultDynamicSmemBytes = 48 * 1024;
constexpr unsigned kMaxGridYZ = 65535;

// The summary of a column-masked call's mask over the kernel's key blocks, and where the launch
// runs more CTAs than fit at once, the CTAs' order by their work (common/work_order.h: without it,
// mixed-length documents left the SMs idle for much of the launch's end), in the stream's buffer
// (the next call on the stream may overwrite it: launches on one stream run in order). Where that
// buffer would have to grow while the stream is captured into a CUDA graph (torch's graphs capture
// on streams the library may not have seen), a stream-ordered allocation instead, which the graph
// records and frees itself (`owned`, freed after the kernel by release()).
// FUSEDATTN_COLUMN_ORDER=1 orders every launch, =0 none (tests, A/B measurements).
struct ColumnScratch {
  ColumnSummary summary;
  void* owned = nullptr;

  // ctas_per_sm: how many of the kernel's CTAs an SM runs at once.
  template <int kBlockM, int kBlockN>
  static ColumnScratch of(const FwdParams& p, int ctas_per_sm) {
    const auto stream = static_cast<cudaStream_t>(p.stream);
    const int64_t summary_bytes = round_up(column_summary_bytes(p, kBlockN), kScratchAlign);
    // No keys: no block to summarise (the kernel visits none), and nothing to allocate.
    if (summary_bytes == 0) return {};
    const int64_t m_blocks = ceil_div(p.seqlen_q, kBlockM);
    const int64_t items = m_blocks * p.heads_q * p.batch;
    const int64_t resident = int64_t{device_attribute(cudaDevAttrMultiProcessorCount, p.device.index)} * ctas_per_sm;
    const bool ordered = env_switch_or("FUSEDATTN_COLUMN_ORDER", items > resident);
    const int64_t work_bytes = round_up(forward_column_work_entries(p, kBlockM) * int64_t{sizeof(int)}, kScratchAlign);
    const int64_t bytes = summary_bytes + (ordered ? work_bytes + items * int64_t{sizeof(int)} : 0);
    const StreamBuffer buf = stream_buffer(StreamBufferUser::kColumnSummary, stream, bytes);
    ColumnScratch s;
    char* base = buf.base;
    if (base == nullptr) {
      FUSEDATTN_CUDA_CHECK(cudaMallocAsync(&s.owned, static_cast<size_t>(bytes), stream));
      base = static_cast<char*>(s.owned);
    }
    s.summary = summarize_column_mask(p, kBlockN, reinterpret_cast<int4*>(base));
    if (ordered) {
      int* work = reinterpret_cast<int*>(base + summary_bytes);
      int* order = reinterpret_cast<int*>(base + summary_bytes + work_bytes);
      order_by_work(forward_column_work(p, s.summary, kBlockM, kBlockN, work), order, stream);
      s.summary.order = order;
    }
    return s;
  }

  void release(cudaStream_t stream) const {
    if (owned != nullptr) FUSEDATTN_CUDA_CHECK(cudaFreeAsync(owned, stream));
  }

 private:
  static constexpr int64_t kScratchAlign = 256;  // each part starts on its own cache lines
};

template <typename Element, int kHeadDim, MaskKind kMask>
void run_fwd(const FwdParams& params) {
  using Cfg = FwdConfig<kHeadDim>;
  // FUSEDATTN_SM80_DECODE_ROWS=0 runs a grouped decode head by head (A/B measurements).
  const FwdParams p = env_switch_or("FUSEDATTN_SM80_DECODE_ROWS", true) ? decode_groups_as_rows(params) : params;
  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) return;
  if (static_cast<unsigned>(p.heads_q) > kMaxGridYZ || static_cast<unsigned>(p.batch) > kMaxGridYZ)
    throw Error(ErrorCode::kUnsupported, "q",
                "the sm80 forward kernel supports at most " + std::to_string(kMaxGridYZ) + " heads and sequences");
  if (p.seqlen_q >= kMaxMaskedSeqlen || p.seqlen_k >= kMaxMaskedSeqlen)
    throw Error(ErrorCode::kUnsupported, "q",
                "the sm80 forward kernel supports sequences shorter than " + std::to_string(kMaxMaskedSeqlen));
  auto kernel = fwd_kernel<Element, kHeadDim, kMask>;
  if constexpr (Cfg::kSmemBytes > kDefaultDynamicSmemBytes)
    FUSEDATTN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
  const int64_t m_blocks = ceil_div(p.seqlen_q, Cfg::kBlockM);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const KvSplit split =
      kMask == MaskKind::kFull ? plan_kv_split(p, m_blocks * p.heads_q * p.batch, Cfg::kMinBlocksPerSm, kHeadDim)
                               : KvSplit{};
  const dim3 grid(static_cast<unsigned>(m_blocks * split.parts), static_cast<unsigned>(p.heads_q),
                  static_cast<unsigned>(p.batch));
  // A pair's K and V: 2 seqlen_k rows of head_dim elements (fwd_cta).
  const int schedule_shift =
      kMask == MaskKind::kFull
          ? 0
          : cuda::schedule_shift(2 * p.seqlen_k * p.head_dim * static_cast<int64_t>(sizeof(Element)), p.heads_q * p.batch);
  using KVTile = TileIo<Element, Cfg::kBlockN, kHeadDim, Cfg::kPitch, Cfg::kThreads>;
  const ColumnScratch columns =
      kMask == MaskKind::kColumn
          ? ColumnScratch::of<Cfg::kBlockM, Cfg::kBlockN>(p, Cfg::kMinBlocksPerSm)
          : ColumnScratch{};
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, schedule_shift, KVTile::steps(p.k_stride.row),
                                                          KVTile::steps(p.v_stride.row), split, columns.summary);
  FUSEDATTN_CHECK_LAUNCH();
  columns.release(stream);
  if (split.parts > 1) combine_kv_split(p, split);
}

}  // namespace fusedattn::cuda::sm80
