// Which plan the CPU backward takes (backward.cpp). The fused plan computes each tile's S and dP
// once (5 tile products) but has only one task per (batch, KV head), each holding its group's dQ
// rows in fp32; the two-pass plan recomputes them for dQ (7 products) and has a task per key block
// and per query block. So the fused plan wins where its tasks keep the threads about as busy as
// 5 / 7 of the work would, and its rows fit in memory.
#pragma once

#include <cstdint>
#include <optional>

#include "cpu/isa.h"
#include "cuda/common/env.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// The fused plan's dQ rows (and their per-row delta and LSE) per task, at most: a 16k-row MHA
// head at d256 fits, and a call's threads hold this much each at the same time.
inline constexpr int64_t kMaxFusedRowBytes = int64_t{32} << 20;

// The share of the threads' time the fused tasks keep them busy, at least: 3 / 4 (3 tasks on 2
// threads or 6 on 4 just pass, 5 on 4 keep them 5 / 8 busy and do not). It sits a little above
// 5 / 7 to leave a margin for tasks of unequal length (causal masks, variable-length batches).
inline constexpr int kBusyNumerator = 3, kBusyDenominator = 4;

// An on/off switch (cuda/common/env.h's rule) over the choice below, for tests and A/B runs: on, the
// fused plan wherever its rows fit; off, two passes.
inline constexpr const char* kFusedBackwardSwitch = "FUSEDATTN_CPU_FUSED_BWD";

// pairs: batch x KV heads; threads: the call's worker threads (already resolved, >= 1);
// row_bytes: one task's dQ rows and their statistics.
inline bool fuses_dq(int64_t pairs, int threads, int64_t row_bytes) {
  if (pairs <= 0 || row_bytes > kMaxFusedRowBytes) return false;
  if (const std::optional<bool> forced = cuda::env_switch(kFusedBackwardSwitch)) return *forced;
  const int64_t rounds = (pairs + threads - 1) / threads;
  return pairs * kBusyDenominator >= rounds * threads * kBusyNumerator;
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
