// Arbitrary strides: q, k and v as views into one packed QKV buffer, outputs and lse written
// through padded strides, varlen with generous max_seqlen. Only the last dimension is contiguous,
// which is all the API promises; nothing outside the views may be written.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {


TEST(CpuStrides, PackedQkvAndPaddedOutputs) {
  constexpr int B = 2, S = 70, H = 4, D = 40;
  constexpr int kOutPad = 24;  // extra elements at the end of every out row
  constexpr int kLsePad = 5;   // extra lse entries after every head's row
  Problem p = with_mask(dense(B, H, H, S, S, D), true, 30, -1);
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937_64 rng = fresh_rng();
    // qkv [B, S, 3, H, D] as flash_attn's qkvpacked layout, flattened to rank 4 for HostTensor.
    HostTensor qkv(dtype, {B, S, 3 * H, D});
    qkv.fill(randn(rng, qkv.numel(), 1.0, dtype));
    const int64_t row = 3 * H * D, batch = S * row;
    ForwardArgs a;
    a.q = strided_view(qkv, 0, {B, S, H, D}, {batch, row, D, 1});
    a.k = strided_view(qkv, H * D, {B, S, H, D}, {batch, row, D, 1});
    a.v = strided_view(qkv, 2 * H * D, {B, S, H, D}, {batch, row, D, 1});
    HostTensor out_buf(dtype, {B, S, H * D + kOutPad, 1});
    out_buf.poison();
    const int64_t out_row = H * D + kOutPad;
    a.out = strided_view(out_buf, 0, {B, S, H, D}, {S * out_row, out_row, D, 1});
    HostTensor lse_buf(DType::kFloat32, {B, H, S + kLsePad});
    lse_buf.poison();
    a.lse = strided_view(lse_buf, 0, {B, H, S}, {H * (S + kLsePad), S + kLsePad, 1});
    a.options = options_for(p);
    forward(a);

    Tensors t;
    t.q = gather_dense(a.q);
    t.k = gather_dense(a.k);
    t.v = gather_dense(a.v);
    Tensors ref = t, plain = t;
    reference_forward(p, ref);
    plain_forward(p, dtype, plain);
    std::vector<double> lse;
    const auto lse_all = lse_buf.to_double();
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < S; ++i) lse.push_back(lse_all[(b * H + h) * (S + kLsePad) + i]);
    expect_matches("out", dtype, gather_dense(a.out), ref.out, plain.out, kFp32OutAtol, kFp32OutRtol, atol_for(dtype), p.str());
    expect_matches("lse", dtype, lse, ref.lse, plain.lse, kFp32LseAtol, kFp32LseRtol, kLseAtol, p.str());
    // The padding was never written: still the poison.
    const auto out_all = out_buf.to_double();
    for (int64_t r = 0; r < B * S; ++r)
      for (int k = 0; k < kOutPad; ++k) ASSERT_TRUE(std::isnan(out_all[r * out_row + H * D + k])) << "out padding written";
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int k = 0; k < kLsePad; ++k)
          ASSERT_TRUE(std::isnan(lse_all[(b * H + h) * (S + kLsePad) + S + k])) << "lse padding written";

    // Backward through the same strided views, gradients into a packed dqkv buffer.
    HostTensor dout(dtype, {B, S, H, D});
    const std::vector<double> dout_values = randn(rng, dout.numel(), 1.0, dtype);
    dout.fill(dout_values);
    HostTensor dqkv(dtype, {B, S, 3 * H, D});
    dqkv.poison();
    BackwardArgs g = backward_args_of(a);
    g.dout = dout.view();
    g.dq = strided_view(dqkv, 0, {B, S, H, D}, {batch, row, D, 1});
    g.dk = strided_view(dqkv, H * D, {B, S, H, D}, {batch, row, D, 1});
    g.dv = strided_view(dqkv, 2 * H * D, {B, S, H, D}, {batch, row, D, 1});
    backward(g);
    ref.dout = dout_values;
    plain.dout = dout_values;
    reference_backward(p, ref);
    plain_backward(p, dtype, plain);
    expect_matches("dq", dtype, gather_dense(g.dq), ref.dq, plain.dq, kFp32GradAtol, kFp32GradRtol, atol_for(dtype), p.str());
    expect_matches("dk", dtype, gather_dense(g.dk), ref.dk, plain.dk, kFp32GradAtol, kFp32GradRtol, atol_for(dtype), p.str());
    expect_matches("dv", dtype, gather_dense(g.dv), ref.dv, plain.dv, kFp32GradAtol, kFp32GradRtol, atol_for(dtype), p.str());
  }
}

TEST(CpuStrides, VarlenWithLargerMaxSeqlen) {
  // max_seqlen only bounds the lengths; a generous value must not change the result.
  const Problem p = packed(2, 1, 32, {30, 0, 70}, {50, 9, 60});
  for (DType dtype : kCpuDtypes) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(with_mask(p, true, -1, -1), dtype, Layout::kBSHD, rng);
    ForwardArgs a = forward_args(c);
    a.options.max_seqlen_q += 1000;
    a.options.max_seqlen_k += 1000;
    forward(a);
    Tensors ref = c.values, plain = c.values;
    reference_forward(c.problem, ref);
    plain_forward(c.problem, dtype, plain);
    expect_matches("out", dtype, c.out.to_double(), ref.out, plain.out, kFp32OutAtol, kFp32OutRtol, atol_for(dtype),
                   case_name(c));
    expect_matches("lse", dtype, c.lse.to_double(), ref.lse, plain.lse, kFp32LseAtol, kFp32LseRtol, kLseAtol,
                   case_name(c));
  }
}

}  // namespace
}  // namespace fusedattn::testing
