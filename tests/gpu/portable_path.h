// Forces the portable (sm80-instruction) forward for the lifetime of the object, also on Hopper,
// and restores default dispatch afterwards: FUSEDATTN_DISABLE_SM90 is process-wide, so a test that
// leaves it set would silently move every later test in the binary off the Hopper kernel.
#pragma once

#include <cstdlib>

namespace fusedattn::testing {

class PortablePathOnly {
 public:
  PortablePathOnly() { setenv("FUSEDATTN_DISABLE_SM90", "1", 1); }
  ~PortablePathOnly() { unsetenv("FUSEDATTN_DISABLE_SM90"); }
  PortablePathOnly(const PortablePathOnly&) = delete;
  PortablePathOnly& operator=(const PortablePathOnly&) = delete;
};

}  // namespace fusedattn::testing
