// Host launcher of the sm80 backward: preprocess -> main kernel -> dQ convert, all on p.stream,
// all scratch in p.workspace (sized by bwd_workspace_bytes). Instantiated once per (element,
// head dim, mask kind) in src/cuda/instances/.
//
// Deterministic mode: the main kernel adds each KV block's dQ share in increasing KV-block order
// (a per-query-block semaphore in the workspace) instead of with fp32 atomics, so every run sums
// in the same order and the result is bit-identical. Cost: a CTA may wait for its predecessor on
// the same query block; KV blocks of one head start in order, so the waits form a pipeline and
// the slowdown is mostly visible when few (batch, head) pairs run at once.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "cuda/common/kinds.h"
#include "cuda/sm80/bwd_aux.h"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda::sm80 {

template <typename Element, int kHeadDim, MaskKind kMask>
void run_bwd(const BwdParams& p) {
  using T = BwdTile<kHeadDim>;
  constexpr int kSharedBytes = static_cast<int>(sizeof(BwdShared<Element, kHeadDim>));
  static_assert(kSharedBytes <= kSm80MaxSharedBytes, "backward tile does not fit sm80 shared memory");

  auto stream = static_cast<cudaStream_t>(p.stream);
  const BwdWorkspace ws = bwd_workspace_view(p);
  launch_bwd_preprocess<Element>(p, ws, stream);

  if (p.seqlen_k > 0) {
    const auto kernel = bwd_main_kernel<Element, kHeadDim, kMask>;
    FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    // blockIdx.x (the KV block) varies fastest, so lower KV blocks of a head start first: the
    // deterministic mode's ordered dQ adds rely on that.
    const dim3 grid(static_cast<unsigned>((p.seqlen_k + T::kBlockN - 1) / T::kBlockN),
                    static_cast<unsigned>(p.heads_kv * T::kColSplit), static_cast<unsigned>(p.batch));
    kernel<<<grid, T::kThreads, kSharedBytes, stream>>>(p, ws);
    FUSEDATTN_CHECK_LAUNCH();
  }

  launch_bwd_convert_dq<Element>(p, ws, stream);
}

}  // namespace fusedattn::cuda::sm80
