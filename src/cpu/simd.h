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
inline Vec broadcast(float x) { return Vec{x, x, x, x}; }

}  // namespace fusedattn::cpu
