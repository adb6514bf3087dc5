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

// fence.proxy.async.global; PTX ISA 8.0, sm_90: orders this thread's global accesses in the async
// proxy (bulk tensor reductions) against its ordinary ones (a semaphore's acquire or release).
__device__ __forceinline__ void fence_proxy_async_global() {
  ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_global);
}

}  // namespace fusedattn::cuda::ptx
