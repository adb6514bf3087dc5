// Named hardware barriers of the forward kernel (id 0 belongs to __syncthreads).
#pragma once

#include <cstdint>

namespace fusedattn::cuda::sm90 {

enum class NamedBarrier : uint32_t {
  kSchedulerWg0 = 1,  // consumer warpgroup 0 may issue its next GEMMs (ping-pong)
  kSchedulerWg1 = 2,
  kEpilogueWg0 = 3,  // the 128 threads of consumer warpgroup 0 meet around the O staging
  kEpilogueWg1 = 4,
};

constexpr uint32_t barrier_id(NamedBarrier b, int warpgroup) { return static_cast<uint32_t>(b) + warpgroup; }

}  // namespace fusedattn::cuda::sm90
