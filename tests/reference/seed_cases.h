// The seed document's attention cases, shared by the CPU and GPU seed suites so both cover the
// same shapes at the same settings: (Z, H, N_CTX, HEAD_DIM) in the (batch, heads, seqlen, dim)
// layout, inputs N(0, 0.5), sm_scale 0.5, judged by |got - ref| <= atol + rtol |ref|.
#pragma once

#include <cstdint>

#include "reference/problems.h"

namespace fusedattn::testing {

constexpr double kSeedStddev = 0.5;
constexpr float kSeedScale = 0.5f;
constexpr double kSeedAtol = 1e-2, kSeedRtol = 1e-2;
// The causal case is judged at an absolute tolerance only.
constexpr double kSeedCausalAtol = 1e-2, kSeedCausalRtol = 0.0;
// Problems with more multiply-adds (Z*H*N*N*D) than this compare samples only: the naive float64
// reference would dominate the suite's run time.
constexpr int64_t kSeedFullReferenceBudget = int64_t{1} << 28;

// X(name, Z, H, N_CTX, HEAD_DIM) for every non-causal seed case; each suite makes an fp16 and a
// bf16 test of each, named name_fp16 and name_bf16. (The causal case, Z1H2N1024D64_causal, is
// spelled out in each suite.)
#define FUSEDATTN_SEED_CASES(X)        \
  X(Z1H1N128D128, 1, 1, 128, 128)      \
  X(Z1H2N256D256, 1, 2, 256, 256)      \
  X(Z2H2N128D256, 2, 2, 128, 256)      \
  X(Z4H32N64D64, 4, 32, 64, 64)        \
  X(Z4H32N1024D64, 4, 32, 1024, 64)    \
  X(Z4H32N4096D64, 4, 32, 4096, 64)

inline Problem seed_problem(int z, int h, int64_t n, int d, bool causal) {
  Problem p = dense(z, h, h, n, n, d);
  p.softmax_scale = kSeedScale;
  p.causal = causal;
  return p;
}

// Whether the full float64 reference is affordable for p (else: compare samples).
inline bool seed_full_reference(const Problem& p) {
  return int64_t{p.batch} * p.heads_q * p.seqlen_q * p.seqlen_k * p.head_dim <= kSeedFullReferenceBudget;
}

}  // namespace fusedattn::testing
