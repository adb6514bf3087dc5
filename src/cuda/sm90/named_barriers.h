// Named hardware barriers of the forward kernel (id 0 belongs to __syncthreads): one turn barrier
// and one epilogue barrier per consumer warpgroup, for up to kMaxConsumerWarpgroups of them, and
// the two of the O staging in a K/V stage.
#pragma once

#include <cstdint>

#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

enum class NamedBarrier : uint32_t {
  kTurn = 1,                                    // + w: consumer warpgroup w may issue its next GEMMs
  kEpilogue = 1 + kMaxConsumerWarpgroups,       // + w: warpgroup w's 128 threads meet around the O staging
  // O staged in the last KV block's stage (KernelConfig::kStagesOInKV), two warpgroups: warpgroup
  // 1 has read the stage's K (its last Q K^T done), so warpgroup 0 may stage O there ...
  kKStageRead = 1 + 2 * kMaxConsumerWarpgroups,
  // ... and warpgroup 0 has read the stage's V (its last P V done), so warpgroup 1 may stage there.
  kVStageRead,
};

constexpr uint32_t barrier_id(NamedBarrier b, int warpgroup) { return static_cast<uint32_t>(b) + warpgroup; }
constexpr uint32_t kHardwareNamedBarriers = 16;
static_assert(static_cast<uint32_t>(NamedBarrier::kVStageRead) < kHardwareNamedBarriers);

}  // namespace fusedattn::cuda::sm90
