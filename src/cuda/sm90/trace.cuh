// Per-tile clock stamps of the Hopper forward, to see where a tile boundary's time goes
// (docs/hopper.md, "Tracing a tile boundary"). Compiled only into a build configured with
// -DFUSEDATTN_SM90_TRACE=ON; elsewhere FUSEDATTN_SM90_STAMP expands to nothing, so the kernels
// are unchanged. With it, a launch run with FUSEDATTN_SM90_TRACE_FILE=path appends its stamps to
// that file (fwd_launch.cuh) and tools/sm90_trace.py reads them.
//
// A stamp is the SM's clock64, so stamps compare only within one SM: each comes with its SM, the
// role that took it (the producer thread, or lane 0 of a consumer warpgroup's warp 0) and the tile.
// The clock is read first, so a stamp's own stores come after the time it records.
#pragma once

#include <cstdint>

#include "cuda/sm90/trace.h"

namespace fusedattn::cuda::sm90 {

#ifdef FUSEDATTN_SM90_TRACE
// Each (CTA, role) fills its own stretch of the buffer and counts its stamps in shared memory, so a
// stamp is a clock read and two stores. (An atomicAdd on one global counter for the slot put an
// L2 round trip, ~1000 cycles, on the stamping thread's path at every stamp.) Only one thread
// per role stamps: the producer thread and lane 0 of each consumer warpgroup's warp 0.
__device__ __forceinline__ uint32_t* trace_counts() {
  __shared__ uint32_t counts[kTraceRoles];
  return counts;
}
// By thread 0 before the kernel's first __syncthreads.
__device__ __forceinline__ void trace_reset() {
  for (int r = 0; r < kTraceRoles; ++r) trace_counts()[r] = 0;
}
__device__ __forceinline__ void trace_stamp(const TraceBuffer& buffer, TraceEvent event, int role, int tile,
                                            int blocks) {
  if (buffer.records == nullptr) return;
  const uint64_t clock = clock64();
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const int slot_role = trace_role_slot(role);
  const uint32_t n = trace_counts()[slot_role]++;
  if (n < buffer.per_role)
    buffer.records[(blockIdx.x * kTraceRoles + slot_role) * buffer.per_role + n] = {
        clock, sm, static_cast<uint16_t>(event), static_cast<uint16_t>(role), tile, blocks};
  else
    atomicAdd(buffer.dropped, 1ull);  // no return value wanted: a fire-and-forget reduction
}
// One stamp by the calling thread; `params` is the KernelParams, `event` a TraceEvent.
#define FUSEDATTN_SM90_STAMP(params, event, role, tile, blocks) \
  ::fusedattn::cuda::sm90::trace_stamp((params).trace, event, role, tile, blocks)
#define FUSEDATTN_SM90_TRACE_RESET() ::fusedattn::cuda::sm90::trace_reset()
// A consumer warpgroup's stamp: lane 0 of its warp 0 takes it (the one thread per role that the
// counters above rely on).
#define FUSEDATTN_SM90_WARPGROUP_STAMP(params, event, warpgroup, warp, lane, tile, blocks) \
  do {                                                                                   \
    if ((warp) == 0 && (lane) == 0) FUSEDATTN_SM90_STAMP(params, event, warpgroup, tile, blocks); \
  } while (0)
// A stamp taken once `value` is computed: the empty asm's input holds the clock read back until
// the instruction that makes `value` has issued (a warp issues in order, so that instruction's
// wait for its operands, e.g. loads landing, comes first).
#define FUSEDATTN_SM90_STAMP_AFTER(params, event, role, value) \
  do {                                                        \
    asm volatile("" ::"f"(value));                            \
    FUSEDATTN_SM90_STAMP(params, event, role, -1, 0);         \
  } while (0)
#else
#define FUSEDATTN_SM90_STAMP(params, event, role, tile, blocks) ((void)0)
#define FUSEDATTN_SM90_TRACE_RESET() ((void)0)
#define FUSEDATTN_SM90_WARPGROUP_STAMP(params, event, warpgroup, warp, lane, tile, blocks) ((void)0)
#define FUSEDATTN_SM90_STAMP_AFTER(params, event, role, value) ((void)0)
#endif

}  // namespace fusedattn::cuda::sm90
