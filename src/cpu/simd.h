// A 4-wide float vector through the GCC/Clang vector extension: plain SSE2 on any x86-64 and
// NEON on AArch64, so the build needs no -march flag yet the hot loops keep accumulators in
// registers (the auto-vectoriser does not register-block the tile products by itself).
#pragma once

#include <cstring>

namespace fusedattn::cpu {

inline constexpr int kVecWidth = 4;
typedef float Vec __attribute__((vector_size(kVecWidth * sizeof(float))));

inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));  // unaligned load
  return v;
}
inline void store_vec(float* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }
static_assert(kVecWidth == 4, "broadcast() spells out four lanes");
inline Vec broadcast(float x) { return Vec{x, x, x, x}; }

}  // namespace fusedattn::cpu

// The per-task functions that hold the hot loops are compiled twice on x86-64 Linux with GCC:
// once for x86-64-v3 (AVX2 + FMA, three-operand forms) and once for the baseline; the dynamic
// loader picks one per machine (ifunc). The build flags stay portable, and a given machine always
// runs the same clone, so results stay bit-identical run to run there (FMA contraction can make
// them differ in the last bits between machines of different ISA levels).
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
// noinline: once inlined into a caller without the attribute, the baseline code would be used.
#define FUSEDATTN_CPU_HOT __attribute__((noinline, target_clones("arch=x86-64-v3", "default")))
#else
#define FUSEDATTN_CPU_HOT
#endif
