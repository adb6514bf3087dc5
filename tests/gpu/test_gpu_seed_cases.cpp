// The seed document's cases on the GPU, by name: (Z, H, N_CTX, HEAD_DIM) in the (batch, heads,
// seqlen, dim) layout, inputs N(0, 0.5), sm_scale 0.5, |got - ref| <= atol + rtol |ref| against
// the float64 reference. Large problems compare sampled rows (forward) and sampled heads
// (backward: for multi-head attention one head's gradients depend on that head alone).
#include <gtest/gtest.h>

#include "gpu/gpu_check.h"
#include "reference/seed_cases.h"

namespace fusedattn::testing {
namespace {

// Above the full-reference budget: how many rows (forward) and heads (backward) are compared.
constexpr int kSampledRows = 256;
constexpr int kSampledHeads = 2;

enum class Direction { kForward, kForwardBackward };
// The backward reference of one 4096-long head takes tens of seconds: longer seed cases run only
// their forward here, and their backward in GpuSeedCasesLarge.
constexpr int64_t kQuickBackwardMaxSeqlen = 1024;
constexpr Direction quick_direction(int64_t n) {
  return n <= kQuickBackwardMaxSeqlen ? Direction::kForwardBackward : Direction::kForward;
}

SkipReason run_seed_case(int z, int h, int64_t n, int d, DType dtype, Direction direction, bool causal = false,
                         double atol = kSeedAtol, double rtol = kSeedRtol, int sampled_heads = kSampledHeads) {
  const Problem p = seed_problem(z, h, n, d, causal);
  const bool backward = direction == Direction::kForwardBackward;
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, Layout::kBHSD, rng, kSeedStddev, backward);
  DeviceCase dc(c);
  if (SkipReason skip = dc.forward()) return skip;
  if (backward)
    if (SkipReason skip = dc.backward()) return skip;
  const std::string name = case_name(c);
  if (seed_full_reference(p)) {
    Tensors ref = c.values;
    reference_forward(p, ref);
    EXPECT_TRUE(all_close(c.out.to_double(), ref.out, atol, rtol)) << "out of " << name;
    EXPECT_TRUE(all_close(c.lse.to_double(), ref.lse, atol, rtol)) << "lse of " << name;
    if (!backward) return std::nullopt;
    reference_backward(p, ref);
    EXPECT_TRUE(all_close(c.dq.to_double(), ref.dq, atol, rtol)) << "dq of " << name;
    EXPECT_TRUE(all_close(c.dk.to_double(), ref.dk, atol, rtol)) << "dk of " << name;
    EXPECT_TRUE(all_close(c.dv.to_double(), ref.dv, atol, rtol)) << "dv of " << name;
    return std::nullopt;
  }
  const SampledForward s = sample_forward(p, dtype, c.q, c.k, c.v, c.out, c.lse, sample_rows(p, rng, kSampledRows));
  EXPECT_TRUE(all_close(s.got_out, s.ref_out, atol, rtol)) << "sampled out rows of " << name;
  EXPECT_TRUE(all_close(s.got_lse, s.ref_lse, atol, rtol)) << "sampled lse rows of " << name;
  if (!backward) return std::nullopt;
  std::uniform_int_distribution<int> pick_b(0, z - 1), pick_h(0, h - 1);
  for (int k = 0; k < sampled_heads; ++k) {
    const int b = k == 0 ? z - 1 : pick_b(rng), hh = k == 0 ? h - 1 : pick_h(rng);
    HeadSlice slice = slice_head(c, b, hh);
    reference_backward(slice.problem, slice.t);
    EXPECT_TRUE(all_close(slice.got_dq, slice.t.dq, atol, rtol)) << "dq of head " << hh << ", batch " << b << " of " << name;
    EXPECT_TRUE(all_close(slice.got_dk, slice.t.dk, atol, rtol)) << "dk of head " << hh << ", batch " << b << " of " << name;
    EXPECT_TRUE(all_close(slice.got_dv, slice.t.dv, atol, rtol)) << "dv of head " << hh << ", batch " << b << " of " << name;
  }
  return std::nullopt;
}

#define FUSEDATTN_GPU_SEED_CASE(name, z, h, n, d)                                                         \
  TEST(GpuSeedCases, name##_fp16) {                                                                        \
    FUSEDATTN_REQUIRE_GPU();                                                                               \
    FUSEDATTN_RUN_OR_SKIP(run_seed_case(z, h, n, d, DType::kFloat16, quick_direction(n)));                 \
  }                                                                                                        \
  TEST(GpuSeedCases, name##_bf16) {                                                                        \
    FUSEDATTN_REQUIRE_GPU();                                                                               \
    FUSEDATTN_RUN_OR_SKIP(run_seed_case(z, h, n, d, DType::kBFloat16, quick_direction(n)));                \
  }
FUSEDATTN_SEED_CASES(FUSEDATTN_GPU_SEED_CASE)
#undef FUSEDATTN_GPU_SEED_CASE

TEST(GpuSeedCasesLarge, Z4H32N4096D64_backward_fp16) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(run_seed_case(4, 32, 4096, 64, DType::kFloat16, Direction::kForwardBackward, false, kSeedAtol,
                                      kSeedRtol, /*sampled_heads=*/1));
}
TEST(GpuSeedCasesLarge, Z4H32N4096D64_backward_bf16) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(run_seed_case(4, 32, 4096, 64, DType::kBFloat16, Direction::kForwardBackward, false, kSeedAtol,
                                      kSeedRtol, /*sampled_heads=*/1));
}

// The causal case, forward and backward.
TEST(GpuSeedCases, Z1H2N1024D64_causal_fp16) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(run_seed_case(1, 2, 1024, 64, DType::kFloat16, Direction::kForwardBackward, true,
                                      kSeedCausalAtol, kSeedCausalRtol));
}
TEST(GpuSeedCases, Z1H2N1024D64_causal_bf16) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(run_seed_case(1, 2, 1024, 64, DType::kBFloat16, Direction::kForwardBackward, true,
                                      kSeedCausalAtol, kSeedCausalRtol));
}

}  // namespace
}  // namespace fusedattn::testing
