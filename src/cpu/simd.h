// A float vector through the GCC/Clang vector extension: 8 wide in the base build (one AVX2
// register in the x86-64-v3 clone of the hot functions, FUSEDATTN_CPU_HOT; two SSE2 or NEON
// registers elsewhere), 16 wide in the AVX-512 build (isa.h: one AVX-512 register). So the build
// needs no -march flag yet the hot loops keep accumulators in registers (the auto-vectoriser does
// not register-block the tile products by itself). 8 rather than 4 lanes: the CPU forward and
// backward ran 1.5-1.6x faster on an AVX-512 EPYC (docs/perf.md, forty-ninth session); 16 in the
// AVX-512 build another 1.45-1.55x on a Zen 5 EPYC (fifty-second session). The baseline clone
// (x86-64 without AVX2) has half the registers for them; its speed was not measured.
#pragma once

#include <cstddef>
#include <cstring>
#include <utility>

#include "cpu/isa.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

#if defined(FUSEDATTN_CPU_AVX512)
inline constexpr int kVecWidth = 16;
#else
inline constexpr int kVecWidth = 8;
#endif
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
// x in every lane, for constants (one load from the constant pool). The tile loops multiply by
// scalars instead (float * Vec), which GCC turns into one broadcast; a Vec{x, x, ...} of a
// run-time x was assembled one lane insert at a time, and so was a shuffle of lane 0 (GCC 12, in
// the AVX-512 build's softmax: ~5% of the fp32 forward's samples on a Xeon, docs/perf.md
// sixty-ninth session).
template <size_t... kLane>
FUSEDATTN_CPU_INLINE Vec broadcast_lanes(float x, std::index_sequence<kLane...>) {
  return Vec{((void)kLane, x)...};
}
FUSEDATTN_CPU_INLINE Vec broadcast(float x) { return broadcast_lanes(x, std::make_index_sequence<kVecWidth>{}); }

// v with lane i swapped for lane i ^ kStep: the butterfly steps of a horizontal reduction.
template <int kStep, size_t... kLane>
FUSEDATTN_CPU_INLINE Vec xor_lanes(Vec v, std::index_sequence<kLane...>) {
  return __builtin_shufflevector(v, v, static_cast<int>(kLane ^ kStep)...);
}
template <int kStep>
FUSEDATTN_CPU_INLINE Vec xor_lanes(Vec v) {
  return xor_lanes<kStep>(v, std::make_index_sequence<kVecWidth>{});
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA

// The per-task functions that hold the hot loops (FUSEDATTN_CPU_HOT) carry the target. In the
// base build they are compiled twice on x86-64 Linux with GCC: once for x86-64-v3 (AVX2 + FMA,
// three-operand forms) and once for the baseline; the dynamic loader picks one per machine
// (ifunc). In the AVX-512 build once, for x86-64-v4. Only they: the rest of each unit, and every
// inline function of a header outside src/cpu (which both builds compile, and the linker keeps one
// copy of), stays on the portable flags. A given machine always runs the same code, so results
// stay bit-identical run to run there (FMA contraction and the vector width can make them differ
// in the last bits between machines of different ISA levels).
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
// noinline: once inlined into a caller without the attribute, the portable code would be used.
#if defined(FUSEDATTN_CPU_AVX512)
#define FUSEDATTN_CPU_HOT __attribute__((noinline, target("arch=x86-64-v4")))
#else
#define FUSEDATTN_CPU_HOT __attribute__((noinline, target_clones("arch=x86-64-v3", "default")))
#endif
#else
#define FUSEDATTN_CPU_HOT
#endif
