// Heavier GPU tests, all named *Large* so that the default suite can leave them out
// (--gtest_filter=-*Large*): element offsets beyond 2^31 (forward on the default and the portable
// path, backward) and a 256k-token sequence. Inputs are filled at memory speed
// (fill_uniform_fast) and a sample of rows (forward) or whole heads (backward) is checked under
// the 2x rule.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"

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

// A dense MQA problem whose q and out hold more than 2^31 elements (ElementOffsetsBeyondInt32).
Problem beyond_int32_problem() {
  constexpr int64_t kSeq = 32768;
  constexpr int kHeads = 520, kDim = 128;
  return with_mask(dense(1, kHeads, 1, kSeq, kSeq, kDim), true, -1, -1);
}

TEST(GpuLarge, ElementOffsetsBeyondInt32) {
  FUSEDATTN_REQUIRE_GPU();
  // q and out hold 32768 * 520 * 128 = 2.18e9 elements (> 2^31, 4.4 GB each in fp16) while k/v
  // are one head (MQA), keeping memory near 9 GB. Rows past s = 32263 of the last heads sit
  // beyond element 2^31: a 32-bit offset anywhere would misplace them.
  const Problem p = beyond_int32_problem();
  ASSERT_GT(p.total_q() * p.heads_q * int64_t{p.head_dim}, int64_t{1} << 31);
  std::vector<SampledRow> beyond;
  for (int64_t i : {p.seqlen_q - 1, p.seqlen_q - 2, p.seqlen_q - 100, p.seqlen_q - 400})
    for (int h : {p.heads_q - 1, p.heads_q / 2}) beyond.push_back({0, h, i});
  FUSEDATTN_RUN_OR_SKIP(check_large_forward(p, DType::kFloat16, beyond));
}

// The same on the portable (sm80-instruction) forward, which dispatch leaves for the Hopper
// kernel on an H100/H200.
TEST(GpuLarge, PortableForwardElementOffsetsBeyondInt32) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnv portable("FUSEDATTN_DISABLE_SM90", "1");
  const Problem p = beyond_int32_problem();
  std::vector<SampledRow> beyond;
  for (int64_t i : {p.seqlen_q - 1, p.seqlen_q - 100}) beyond.push_back({0, p.heads_q - 1, i});
  FUSEDATTN_RUN_OR_SKIP(check_large_forward(p, DType::kFloat16, beyond));
}

// The backward with every operand and gradient beyond 2^31 elements (16 x 520 heads x 2048 x
// 128, MHA). out/lse come from the forward on the device, except in three (batch, head) slices
// -- the last lies past element 2^31 from its 1544th row on -- which get the float64 reference's
// (as the other backward tests do); those slices' dq/dk/dv are checked whole under the 2x rule.
TEST(GpuLarge, BackwardElementOffsetsBeyondInt32) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr int kBatch = 16, kHeads = 520, kDim = 128;
  constexpr int64_t kSeq = 2048;
  constexpr DType kDtype = DType::kFloat16;
  const Problem p = with_mask(dense(kBatch, kHeads, kHeads, kSeq, kSeq, kDim), true, -1, -1);
  ASSERT_GT(p.total_q() * p.heads_q * int64_t{p.head_dim}, int64_t{1} << 31);
  std::mt19937_64 rng = fresh_rng();
  HostTensor q(kDtype, q_shape(p)), k(kDtype, k_shape(p)), v(kDtype, k_shape(p)), dout(kDtype, q_shape(p));
  HostTensor out(kDtype, q_shape(p)), lse(DType::kFloat32, lse_shape(p));
  HostTensor dq(kDtype, q_shape(p)), dk(kDtype, k_shape(p)), dv(kDtype, k_shape(p));
  for (HostTensor* t : {&q, &k, &v, &dout}) fill_uniform_fast(*t, rng);
  DeviceTensor d_q(q), d_k(k), d_v(v), d_dout(dout), d_out(out), d_lse(lse), d_dq(dq), d_dk(dk), d_dv(dv);
  ForwardArgs f;
  f.q = d_q.view(q), f.k = d_k.view(k), f.v = d_v.view(v), f.out = d_out.view(out), f.lse = d_lse.view(lse);
  f.options = options_for(p);
  if (SkipReason skip = run_unless_missing([&] { forward(f); })) GTEST_SKIP() << *skip;
  cuda_check(cudaDeviceSynchronize(), "forward");
  d_out.download(out);
  d_lse.download(lse);

  struct Slice {
    int b, h;
    Tensors ref, plain;
  };
  std::vector<Slice> slices = {{0, 0, {}, {}}, {kBatch - 1, kHeads / 2, {}, {}}, {kBatch - 1, kHeads - 1, {}, {}}};
  Problem one = p;
  one.batch = 1;
  one.heads_q = one.heads_kv = 1;
  const TensorView out_view = out.view_at(out.data(), Device{}), lse_view = lse.view_at(lse.data(), Device{});
  for (Slice& s : slices) {
    s.ref.q = head_rows(q, kSeq, kDim, s.b, s.h);
    s.ref.k = head_rows(k, kSeq, kDim, s.b, s.h);
    s.ref.v = head_rows(v, kSeq, kDim, s.b, s.h);
    s.ref.dout = head_rows(dout, kSeq, kDim, s.b, s.h);
    s.plain = s.ref;
    reference_forward(one, s.ref);
    reference_backward(one, s.ref);
    plain_backward(one, kDtype, s.plain);
    auto* out_data = static_cast<unsigned char*>(out.data());
    auto* lse_data = static_cast<float*>(lse.data());
    for (int64_t i = 0; i < kSeq; ++i) {
      const int64_t row = s.b * out_view.stride[0] + i * out_view.stride[1] + s.h * out_view.stride[2];
      encode(kDtype, &s.ref.out[i * kDim], out_data + row * dtype_size(kDtype), kDim);
      lse_data[s.b * lse_view.stride[0] + s.h * lse_view.stride[1] + i] = static_cast<float>(s.ref.lse[i]);
    }
  }
  d_out.upload(out);
  d_lse.upload(lse);
  for (DeviceTensor* g : {&d_dq, &d_dk, &d_dv}) g->poison();
  BackwardArgs a;
  a.q = f.q, a.k = f.k, a.v = f.v, a.out = f.out, a.lse = f.lse, a.dout = d_dout.view(dout);
  a.dq = d_dq.view(dq), a.dk = d_dk.view(dk), a.dv = d_dv.view(dv);
  a.options = f.options;
  if (SkipReason skip = run_unless_missing([&] { backward(a); })) GTEST_SKIP() << *skip;
  cuda_check(cudaDeviceSynchronize(), "backward");
  d_dq.download(dq);
  d_dk.download(dk);
  d_dv.download(dv);
  const double atol = atol_for(kDtype);
  for (const Slice& s : slices) {
    SCOPED_TRACE("batch " + std::to_string(s.b) + " head " + std::to_string(s.h));
    EXPECT_TRUE(obeys_2x_rule(head_rows(dq, kSeq, kDim, s.b, s.h), s.plain.dq, s.ref.dq, atol)) << "dq";
    EXPECT_TRUE(obeys_2x_rule(head_rows(dk, kSeq, kDim, s.b, s.h), s.plain.dk, s.ref.dk, atol)) << "dk";
    EXPECT_TRUE(obeys_2x_rule(head_rows(dv, kSeq, kDim, s.b, s.h), s.plain.dv, s.ref.dv, atol)) << "dv";
  }
}

constexpr int64_t k256k = 256 * 1024;

TEST(GpuLarge, SingleSequenceOf256kTokens) {
  FUSEDATTN_REQUIRE_GPU();
  const Problem p = with_mask(dense(1, 4, 2, k256k, k256k, 128), true, -1, -1);
  FUSEDATTN_RUN_OR_SKIP(check_large_forward(p, DType::kBFloat16, {{0, 3, k256k - 1}, {0, 0, k256k / 2}}));
}

TEST(GpuLarge, PortableForwardOfA256kTokenSequence) {
  FUSEDATTN_REQUIRE_GPU();
  const ScopedEnv portable("FUSEDATTN_DISABLE_SM90", "1");
  const Problem p = with_mask(dense(1, 4, 2, k256k, k256k, 128), true, -1, -1);
  FUSEDATTN_RUN_OR_SKIP(check_large_forward(p, DType::kBFloat16, {{0, 3, k256k - 1}, {0, 0, k256k / 2}}));
}

// The backward over one 256k-token sequence (GQA 2/1), every gradient element checked: a causal
// sliding window of 64 keys keeps the float64 reference at O(S * 64) per head.
TEST(GpuLarge, BackwardOfA256kTokenSequence) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr int64_t kWindow = 63;
  const Problem p = with_mask(dense(1, 2, 1, k256k, k256k, 64), true, kWindow, 0);
  FUSEDATTN_RUN_OR_SKIP(check_backward_gpu(p, DType::kFloat16));
}

}  // namespace
}  // namespace fusedattn::testing
