// The CPU backend's entry points: each runs the build of the hot code (isa.h) for this machine,
// the AVX-512 one where the library has it and the CPU and OS support x86-64-v4 (AVX-512 F, BW,
// CD, DQ, VL), unless FUSEDATTN_CPU_AVX512=0 (for tests and A/B runs). Chosen per call from the
// CPU and that variable alone, so a machine gives the same bits call to call.
#include <cstdlib>

#include "cpu/cpu_backend.h"

namespace fusedattn::cpu {

namespace base {
void forward(const FwdParams& params);
void backward(const BwdParams& params);
}  // namespace base

#if defined(FUSEDATTN_CPU_WITH_AVX512)
namespace avx512 {
void forward(const FwdParams& params);
void backward(const BwdParams& params);
}  // namespace avx512

namespace {

bool uses_avx512() {
  const char* env = std::getenv("FUSEDATTN_CPU_AVX512");
  if (env != nullptr && env[0] == '0') return false;
  return __builtin_cpu_supports("x86-64-v4") != 0;
}

}  // namespace
#endif

void forward(const FwdParams& params) {
#if defined(FUSEDATTN_CPU_WITH_AVX512)
  if (uses_avx512()) return avx512::forward(params);
#endif
  base::forward(params);
}

void backward(const BwdParams& params) {
#if defined(FUSEDATTN_CPU_WITH_AVX512)
  if (uses_avx512()) return avx512::backward(params);
#endif
  base::backward(params);
}

}  // namespace fusedattn::cpu
