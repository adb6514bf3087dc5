// The seed document's cases, by name: (Z, H, N_CTX, HEAD_DIM) in the (batch, heads, seqlen, dim)
// layout, inputs N(0, 0.5), sm_scale 0.5, judged by |got - ref| <= atol + rtol |ref| against the
// float64 reference, and by the 2x rule too: with outputs of ~0.1 and lse of ~8, the seed's
// 1e-2 tolerances alone pass a 20% error in out or 0.05 in lse. Problems too large for the full
// reference compare a sample of rows.
#include <gtest/gtest.h>

#include <algorithm>

#include "cpu/cpu_check.h"
#include "reference/seed_cases.h"

namespace fusedattn::testing {
namespace {

// Problems above the full-reference budget compare this many sampled rows and skip the backward.
constexpr int kSampledRows = 192;

// Compares `kSampledRows` random rows (plus the first and last) of out and lse with the
// row-wise reference.
void expect_sampled_rows_close(const Problem& p, const HostCase& c, std::mt19937_64& rng, double atol, double rtol) {
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  std::uniform_int_distribution<int> pick_b(0, p.batch - 1), pick_h(0, p.heads_q - 1);
  std::uniform_int_distribution<int64_t> pick_i(0, p.seqlen_q - 1);
  struct Row {
    int b, h;
    int64_t i;
  };
  std::vector<Row> rows{{0, 0, 0}, {p.batch - 1, p.heads_q - 1, p.seqlen_q - 1}};
  while (rows.size() < static_cast<size_t>(kSampledRows)) rows.push_back({pick_b(rng), pick_h(rng), pick_i(rng)});
  std::vector<double> got, ref, got_out, ref_out, plain_out, got_lse, ref_lse, plain_lse;
  for (const Row& r : rows) {
    const RowResult want = reference_forward_row(p, c.values, r.b, r.h, r.i);
    const RowResult plain = plain_forward_row(p, c.dtype, c.values, r.b, r.h, r.i);
    const int64_t o = out_offset(p, r.b, r.h, r.i);
    got_out.insert(got_out.end(), out.begin() + o, out.begin() + o + p.head_dim);
    ref_out.insert(ref_out.end(), want.out.begin(), want.out.end());
    plain_out.insert(plain_out.end(), plain.out.begin(), plain.out.end());
    got_lse.push_back(lse[lse_offset(p, r.b, r.h, r.i)]);
    ref_lse.push_back(want.lse);
    plain_lse.push_back(plain.lse);
  }
  got = got_out;
  got.insert(got.end(), got_lse.begin(), got_lse.end());
  ref = ref_out;
  ref.insert(ref.end(), ref_lse.begin(), ref_lse.end());
  EXPECT_TRUE(all_close(got, ref, atol, rtol)) << "sampled rows (out and lse) of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(got_out, plain_out, ref_out, atol_for(c.dtype))) << "sampled out rows of " << case_name(c);
  EXPECT_TRUE(obeys_2x_rule(got_lse, plain_lse, ref_lse, kLseAtol)) << "sampled lse rows of " << case_name(c);
}

void run_seed_case(int z, int h, int64_t n, int d, DType dtype, bool causal = false, double atol = kSeedAtol,
                   double rtol = kSeedRtol) {
  const Problem p = seed_problem(z, h, n, d, causal);
  std::mt19937_64 rng = fresh_rng();
  const bool full = seed_full_reference(p);
  HostCase c = make_case(p, dtype, Layout::kBHSD, rng, kSeedStddev, /*with_backward=*/full);
  run_forward(c);
  if (!full) {
    expect_sampled_rows_close(p, c, rng, atol, rtol);
    return;
  }
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  plain_forward(p, dtype, plain);
  const double low = atol_for(dtype);
  const std::string name = case_name(c);
  const auto expect_both = [&](const char* what, const std::vector<double>& got, const std::vector<double>& want,
                               const std::vector<double>& plain_values, double two_x_atol) {
    EXPECT_TRUE(all_close(got, want, atol, rtol)) << what << " of " << name;
    EXPECT_TRUE(obeys_2x_rule(got, plain_values, want, two_x_atol)) << what << " of " << name;
  };
  expect_both("out", c.out.to_double(), ref.out, plain.out, low);
  expect_both("lse", c.lse.to_double(), ref.lse, plain.lse, kLseAtol);
  run_backward(c);
  reference_backward(p, ref);
  plain_backward(p, dtype, plain);
  expect_both("dq", c.dq.to_double(), ref.dq, plain.dq, low);
  expect_both("dk", c.dk.to_double(), ref.dk, plain.dk, low);
  expect_both("dv", c.dv.to_double(), ref.dv, plain.dv, low);
}

#define FUSEDATTN_CPU_SEED_CASE(name, z, h, n, d)                                 \
  TEST(SeedCases, name##_fp16) { run_seed_case(z, h, n, d, DType::kFloat16); } \
  TEST(SeedCases, name##_bf16) { run_seed_case(z, h, n, d, DType::kBFloat16); }
FUSEDATTN_SEED_CASES(FUSEDATTN_CPU_SEED_CASE)
#undef FUSEDATTN_CPU_SEED_CASE

TEST(SeedCases, Z1H2N1024D64_causal_fp16) {
  run_seed_case(1, 2, 1024, 64, DType::kFloat16, true, kSeedCausalAtol, kSeedCausalRtol);
}
TEST(SeedCases, Z1H2N1024D64_causal_bf16) {
  run_seed_case(1, 2, 1024, 64, DType::kBFloat16, true, kSeedCausalAtol, kSeedCausalRtol);
}

}  // namespace
}  // namespace fusedattn::testing
