// Zeroes a host tensor through its ZeroRuns (api/zero_runs.h).
#include <cstring>

#include "api/zero_runs.h"
#include "cpu/cpu_backend.h"

namespace fusedattn::cpu {

void zero_fill(const TensorView& t) {
  const detail::ZeroRuns runs = detail::zero_runs(t);
  char* const base = static_cast<char*>(t.data);
  runs.for_each_block([&](int64_t offset) {
    for (int64_t run = 0; run < runs.height; ++run)
      std::memset(base + offset + run * runs.pitch, 0, static_cast<std::size_t>(runs.width));
  });
}

}  // namespace fusedattn::cpu
