// An 8-wide float vector through the GCC/Clang vector extension: one AVX2 register in the
// x86-64-v3 clone of the hot functions (FUSEDATTN_CPU_HOT), two SSE2 or NEON registers elsewhere,
// so the build needs no -march flag yet the hot loops keep accumulators in registers (the
// auto-vectoriser does not register-block the tile products by itself). 8 rather than 4 lanes:
// the CPU forward and backward ran 1.5-1.6x faster on an AVX-512 EPYC (docs/perf.md, forty-ninth
// session). The baseline clone (x86-64 without AVX2) has half the registers for them; its speed
// was not measured.
#pragma once

#include <cstring>

namespace fusedattn::cpu {

inline constexpr int kVecWidth = 8;
typedef float Vec __attribute__((vector_size(kVecWidth * sizeof(float))));

// The helpers that take or give vectors, and the tile loops built on them, are inlined into the
// hot functions below, so that each clone compiles them for its own target (an out-of-line copy
// would be compiled for the baseline only, and pass 32-byte vectors through memory).
#if defined(__GNUC__)
#define FUSEDATTN_CPU_INLINE inline __attribute__((always_inline))
#else
#define FUSEDATTN_CPU_INLINE inline
#endif

FUSEDATTN_CPU_INLINE Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));  // unaligned load
  return v;
}
FUSEDATTN_CPU_INLINE void store_vec(float* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }
// x in every lane. The tile loops multiply by scalars instead (float * Vec), which GCC turns
// into one broadcast; a Vec{x, x, ...} built there was assembled one lane insert at a time.
static_assert(kVecWidth == 8, "broadcast() spells out eight lanes");
FUSEDATTN_CPU_INLINE Vec broadcast(float x) { return Vec{x, x, x, x, x, x, x, x}; }

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
