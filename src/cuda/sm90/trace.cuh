// Per-tile clock stamps of the Hopper forward, to see where a tile boundary's time goes
// (docs/hopper.md, "Tracing a tile boundary"). Compiled only into a build configured with
// -DFUSEDATTN_SM90_TRACE=ON; elsewhere FUSEDATTN_SM90_STAMP expands to nothing, so the kernels
// are unchanged. With it, a launch run with FUSEDATTN_SM90_TRACE_FILE=path appends its stamps to
// that file (fwd_launch.cuh) and tools/sm90_trace.py reads them.
//
// A stamp is the SM's clock64, so stamps compare only within one SM: each comes with its SM, the
// role that took it (the producer thread, or lane 0 of a consumer warpgroup's warp 0) and the tile.
#pragma once

#include <cstdint>

#include "cuda/sm90/trace.h"

namespace fusedattn::cuda::sm90 {

#ifdef FUSEDATTN_SM90_TRACE
__device__ __forceinline__ void trace_stamp(const TraceBuffer& buffer, TraceEvent event, int role, int tile,
                                            int blocks) {
  if (buffer.records == nullptr) return;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned long long slot = atomicAdd(buffer.count, 1ull);
  if (slot < buffer.capacity)
    buffer.records[slot] = {static_cast<uint64_t>(clock64()), sm, static_cast<uint16_t>(event),
                            static_cast<uint16_t>(role), tile, blocks};
}
// One stamp by the calling thread; `params` is the KernelParams, `event` a TraceEvent.
#define FUSEDATTN_SM90_STAMP(params, event, role, tile, blocks) \
  ::fusedattn::cuda::sm90::trace_stamp((params).trace, event, role, tile, blocks)
#else
#define FUSEDATTN_SM90_STAMP(params, event, role, tile, blocks) ((void)0)
#endif

}  // namespace fusedattn::cuda::sm90
