// Host launcher of the sm80 forward kernel: grid, shared-memory opt-in, stream.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/column_scratch.h"
#include "cuda/common/int_math.h"
#include "cuda/common/schedule.h"
#include "cuda/common/env.h"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/sm80/fwd_kv_split.h"
#include "fusedattn/error.h"

namespace fusedattn::cuda::sm80 {

// Without opting in, a block may use at most 48 KiB of dynamic shared memory.
constexpr int kDefaultDynamicSmemBytes = 48 * 1024;
constexpr unsigned kMaxGridYZ = 65535;

template <typename Element, int kHeadDim, MaskKind kMask>
void run_fwd(const FwdParams& params) {
  using Cfg = FwdConfig<kHeadDim>;
  const FwdParams p = launch_view(params);
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
      kMask == MaskKind::kFull ? plan_kv_split(p, Cfg::kBlockM, Cfg::kMinBlocksPerSm, kHeadDim) : KvSplit{};
  const dim3 grid(static_cast<unsigned>(m_blocks * split.parts), static_cast<unsigned>(p.heads_q),
                  static_cast<unsigned>(p.batch));
  // A pair's K and V: 2 seqlen_k rows of head_dim elements (fwd_cta).
  const int schedule_shift =
      kMask == MaskKind::kFull
          ? 0
          : cuda::schedule_shift(2 * p.seqlen_k * p.head_dim * static_cast<int64_t>(sizeof(Element)), p.heads_q * p.batch);
  using KVTile = TileIo<Element, Cfg::kBlockN, kHeadDim, Cfg::kPitch, Cfg::kThreads>;
  const ColumnScratch columns = kMask == MaskKind::kColumn ? ColumnScratch::of<Cfg::kBlockN>(p) : ColumnScratch{};
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, schedule_shift, KVTile::steps(p.k_stride.row),
                                                          KVTile::steps(p.v_stride.row), split, columns.summary);
  FUSEDATTN_CHECK_LAUNCH();
  columns.release(stream);
  if (split.parts > 1) combine_kv_split(p, split);
}

}  // namespace fusedattn::cuda::sm80
