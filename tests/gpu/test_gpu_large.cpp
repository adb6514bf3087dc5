// Heavier GPU tests, all named *Large* so that the default suite can leave them out
// (--gtest_filter=-*Large*): element offsets beyond 2^31 and a 256k-token sequence. Inputs are
// filled at memory speed (fill_uniform_fast) and a sample of rows is checked under the 2x rule.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/gpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kSampledRows = 48;

// Runs a dense forward on fast-filled inputs and checks sampled rows (plus `extra_rows`).
SkipReason check_large_forward(const Problem& p, DType dtype, std::vector<SampledRow> extra_rows) {
  std::mt19937_64 rng = fresh_rng();
  HostTensor q(dtype, q_shape(p)), k(dtype, k_shape(p)), v(dtype, k_shape(p));
  HostTensor out(dtype, q_shape(p)), lse(DType::kFloat32, lse_shape(p));
  for (HostTensor* t : {&q, &k, &v}) fill_uniform_fast(*t, rng);
  DeviceTensor dq(q), dk(k), dv(v), dout(out), dlse(lse);
  dout.poison();
  dlse.poison();
  ForwardArgs a;
  a.q = dq.view(q);
  a.k = dk.view(k);
  a.v = dv.view(v);
  a.out = dout.view(out);
  a.lse = dlse.view(lse);
  a.options = options_for(p);
  if (SkipReason skip = run_unless_missing([&] { forward(a); })) return skip;
  cuda_check(cudaDeviceSynchronize(), "forward");
  dout.download(out);
  dlse.download(lse);
  std::vector<SampledRow> rows = sample_rows(p, rng, kSampledRows);
  rows.insert(rows.end(), extra_rows.begin(), extra_rows.end());
  std::sort(rows.begin(), rows.end(), [](const SampledRow& x, const SampledRow& y) {
    return std::tie(x.b, x.h, x.i) < std::tie(y.b, y.h, y.i);
  });
  const SampledForward s = sample_forward(p, dtype, q, k, v, out, lse, rows);
  EXPECT_TRUE(obeys_2x_rule(s.got_out, s.plain_out, s.ref_out, atol_for(dtype))) << "sampled out rows of " << p.str();
  EXPECT_TRUE(obeys_2x_rule(s.got_lse, s.plain_lse, s.ref_lse, kLseAtol)) << "sampled lse rows of " << p.str();
  return std::nullopt;
}

TEST(GpuLarge, ElementOffsetsBeyondInt32) {
  FUSEDATTN_REQUIRE_GPU();
  // q and out hold 32768 * 520 * 128 = 2.18e9 elements (> 2^31, 4.4 GB each in fp16) while k/v
  // are one head (MQA), keeping memory near 9 GB. Rows past s = 32263 of the last heads sit
  // beyond element 2^31: a 32-bit offset anywhere would misplace them.
  constexpr int64_t kSeq = 32768;
  constexpr int kHeads = 520, kDim = 128;
  const Problem p = with_mask(dense(1, kHeads, 1, kSeq, kSeq, kDim), true, -1, -1);
  ASSERT_GT(p.total_q() * p.heads_q * int64_t{p.head_dim}, int64_t{1} << 31);
  std::vector<SampledRow> beyond;
  for (int64_t i : {kSeq - 1, kSeq - 2, kSeq - 100, kSeq - 400})
    for (int h : {kHeads - 1, kHeads / 2}) beyond.push_back({0, h, i});
  FUSEDATTN_RUN_OR_SKIP(check_large_forward(p, DType::kFloat16, beyond));
}

TEST(GpuLarge, SingleSequenceOf256kTokens) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr int64_t kSeq = 256 * 1024;
  const Problem p = with_mask(dense(1, 4, 2, kSeq, kSeq, 128), true, -1, -1);
  FUSEDATTN_RUN_OR_SKIP(check_large_forward(p, DType::kBFloat16, {{0, 3, kSeq - 1}, {0, 0, kSeq / 2}}));
}

}  // namespace
}  // namespace fusedattn::testing
