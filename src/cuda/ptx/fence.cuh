// Proxy fences between ordinary ("generic proxy") shared-memory accesses and the async proxy
// (TMA engine, wgmma operand reads), over CCCL's <cuda/ptx>.
#pragma once

#include <cuda/ptx>

namespace fusedattn::cuda::ptx {

// fence.proxy.async.shared::cta; PTX ISA 8.0, sm_90. Each thread that wrote shared memory with
// ordinary stores runs it before the barrier after which a TMA store reads that memory.
__device__ __forceinline__ void fence_proxy_async_shared() {
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);
}

}  // namespace fusedattn::cuda::ptx
