// The two small kernels around the main backward kernel, compiled once per element type in
// bwd_preprocess.cu and bwd_convert.cu (not per head-dim instance).
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm80/bwd_workspace.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// Per query row: delta = -rowsum(dO o O) in fp32, lse2 = lse * log2(e) (+inf where P must be 0),
// a zeroed dq_acc row and, in deterministic mode, zeroed semaphores.
template <typename Element>
void launch_bwd_preprocess(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream);

// dq = Element(dq_acc * scale) for every valid row and column.
template <typename Element>
void launch_bwd_convert_dq(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream);

}  // namespace fusedattn::cuda::sm80
