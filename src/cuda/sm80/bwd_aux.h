// The two small kernels around the main backward kernel, compiled once per element type in
// bwd_preprocess.cu and bwd_convert.cu (not per head-dim instance), and the call that runs them
// around a main kernel.
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

// A backward call on p.stream, every kernel of it on the workspace p.workspace holds: the
// preprocess, launch_main(p, ws, stream) (a main kernel, portable or Hopper; none without keys),
// the dQ convert.
template <typename Element, typename LaunchMain>
void run_bwd_around(const BwdParams& p, LaunchMain launch_main) {
  auto stream = static_cast<cudaStream_t>(p.stream);
  const BwdWorkspace ws = bwd_workspace_view(p);
  launch_bwd_preprocess<Element>(p, ws, stream);
  if (p.seqlen_k > 0) launch_main(p, ws, stream);
  launch_bwd_convert_dq<Element>(p, ws, stream);
}

}  // namespace fusedattn::cuda::sm80
