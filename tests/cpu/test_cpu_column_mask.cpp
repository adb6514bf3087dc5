// Column-sparse masks (Options::column_mask) on the CPU backend. Each mask here hides what the
// float64 reference knows from another description: causal and sliding windows written as
// intervals per key, causal documents packed into one sequence (the reference runs them as the
// variable-length batch of those documents), per-head masks (each head against the reference of
// its own mask), and rows that every key hides from (out 0, lse -inf, no gradient). Forward and
// backward, fp32 by tolerance and fp16/bf16 by the 2x rule. Then the rejections, by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/cpu_check.h"
#include "reference/column_mask.h"

namespace fusedattn::testing {
namespace {

constexpr int kHeadDim = 32;

ForwardArgs masked_forward_args(HostCase& c, Columns& m, bool causal) {
  ForwardArgs a = forward_args(c);
  a.options.causal = causal;
  a.options.window_left = a.options.window_right = -1;
  a.options.column_mask = m.view();
  return a;
}

// Runs c (a dense call, with `causal` and the column mask m) forward and checks out and lse
// against the reference of `truth`, a problem over the same values in the same canonical order.
ForwardArgs check_forward_against(HostCase& c, Columns& m, bool causal, const Problem& truth) {
  const std::string name = case_name(c) + " with a column mask";
  const ForwardArgs f = masked_forward_args(c, m, causal);
  c.out.poison();
  c.lse.poison();
  forward(f);
  Tensors ref = c.values, plain = c.values;
  reference_forward(truth, ref);
  if (c.dtype != DType::kFloat32) plain_forward(truth, c.dtype, plain);
  expect_matches("out", c.dtype, c.out.to_double(), ref.out, plain.out, kFp32OutAtol, kFp32OutRtol, atol_for(c.dtype), name);
  expect_matches("lse", c.dtype, c.lse.to_double(), ref.lse, plain.lse, kFp32LseAtol, kFp32LseRtol, kLseAtol, name);
  return f;
}

// The backward of forward call f (run), under both of the backward's plans, into c's gradients.
void run_masked_backward(HostCase& c, const ForwardArgs& f) {
  BackwardArgs a = backward_args_of(f);
  a.dout = c.dout.view();
  a.dq = c.dq.view();
  a.dk = c.dk.view();
  a.dv = c.dv.view();
  run_backward_both_plans(a, c);
}

// The backward of forward call f (run_masked_backward), against the reference of `truth`.
void check_backward_against(HostCase& c, const ForwardArgs& f, const Problem& truth) {
  const std::string name = case_name(c) + " with a column mask";
  run_masked_backward(c, f);
  Tensors ref = c.values, plain = c.values;
  reference_backward(truth, ref);
  if (c.dtype != DType::kFloat32) plain_backward(truth, c.dtype, plain);
  const double low = atol_for(c.dtype);
  expect_matches("dq", c.dtype, c.dq.to_double(), ref.dq, plain.dq, kFp32GradAtol, kFp32GradRtol, low, name);
  expect_matches("dk", c.dtype, c.dk.to_double(), ref.dk, plain.dk, kFp32GradAtol, kFp32GradRtol, low, name);
  expect_matches("dv", c.dtype, c.dv.to_double(), ref.dv, plain.dv, kFp32GradAtol, kFp32GradRtol, low, name);
}

HostCase fresh_case(const Problem& p, DType dtype) {
  std::mt19937_64 rng = fresh_rng();
  return make_case(p, dtype, Layout::kBSHD, rng);
}

// Causal (square and Sq != Sk) and sliding windows, written as two intervals per key, in one mask
// head shared by every query head (GQA) or one per query head.
TEST(CpuColumnMask, WindowsWrittenAsColumnsMatchTheReference) {
  struct Case {
    int64_t sq, sk, left, right;
  };
  for (const Case& w : {Case{100, 100, -1, 0}, Case{70, 150, -1, 0}, Case{150, 70, -1, 0}, Case{130, 130, 20, 5},
                        Case{90, 200, 64, 0}}) {
    for (const DType dtype : kCpuDtypes) {
      const Problem call = dense(2, 4, 2, w.sq, w.sk, kHeadDim);
      const Problem truth = with_mask(call, false, w.left, w.right);
      for (const int64_t mask_heads : {int64_t{1}, int64_t{4}}) {
        SCOPED_TRACE("window " + std::to_string(w.left) + "," + std::to_string(w.right) + " mask heads " +
                     std::to_string(mask_heads));
        Columns m(2, mask_heads, w.sk, 2);
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t h = 0; h < mask_heads; ++h) hide_outside_window(m, b, h, w.sq, w.sk, w.left, w.right);
        HostCase c = fresh_case(call, dtype);
        check_backward_against(c, check_forward_against(c, m, /*causal=*/false, truth), truth);
      }
    }
  }
}

// Causal documents packed into one sequence (document masks of packed SFT batches): key j of the
// document [s, e) hides from rows [e, S), and causal does the rest. The reference runs the
// documents as a variable-length batch: the same rows in the same order.
TEST(CpuColumnMask, PackedCausalDocumentsMatchTheirVarlenBatch) {
  const std::vector<int64_t> docs = {37, 1, 64, 90, 8};
  const int64_t total = total_length(docs);
  const Problem call = dense(1, 4, 1, total, total, kHeadDim);
  const Problem truth = with_mask(packed(4, 1, kHeadDim, docs, docs), true, -1, -1);
  for (const DType dtype : kCpuDtypes) {
    Columns m(1, 1, total, 1);
    hide_later_documents(m, 0, 0, docs);
    HostCase c = fresh_case(call, dtype);
    check_backward_against(c, check_forward_against(c, m, /*causal=*/true, truth), truth);
  }
}

// Per-head masks: even heads causal, odd heads unmasked (their intervals empty, start >= end);
// each head against the reference of its own mask.
TEST(CpuColumnMask, EachHeadReadsItsOwnMask) {
  const int64_t s = 96;
  const Problem call = dense(1, 4, 2, s, s, kHeadDim);
  for (const DType dtype : kCpuDtypes) {
    Columns m(1, 4, s, 1);
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t j = 0; j < s; ++j) h % 2 == 0 ? m.hide(0, h, j, 0, 0, j) : m.hide(0, h, j, 0, 5, 5);
    HostCase c = fresh_case(call, dtype);
    c.out.poison();
    c.lse.poison();
    forward(masked_forward_args(c, m, /*causal=*/false));
    const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
    for (const bool causal : {true, false}) {
      const Problem truth = with_mask(call, causal, -1, -1);
      Tensors ref = c.values, plain = c.values;
      reference_forward(truth, ref);
      if (dtype != DType::kFloat32) plain_forward(truth, dtype, plain);
      else plain = ref;  // fp32 is held to the tolerance, not the 2x rule
      // Heads of this parity only: out is [1, S, 4, D], lse [1, 4, S].
      std::vector<double> got_o, ref_o, plain_o, got_l, ref_l, plain_l;
      for (int64_t i = 0; i < s; ++i)
        for (int64_t h = causal ? 0 : 1; h < 4; h += 2) {
          const int64_t o = (i * 4 + h) * kHeadDim, l = h * s + i;
          got_o.insert(got_o.end(), out.begin() + o, out.begin() + o + kHeadDim);
          ref_o.insert(ref_o.end(), ref.out.begin() + o, ref.out.begin() + o + kHeadDim);
          plain_o.insert(plain_o.end(), plain.out.begin() + o, plain.out.begin() + o + kHeadDim);
          got_l.push_back(lse[l]);
          ref_l.push_back(ref.lse[l]);
          plain_l.push_back(plain.lse[l]);
        }
      const std::string name = case_name(c) + (causal ? " even heads (causal)" : " odd heads (unmasked)");
      expect_matches("out", dtype, got_o, ref_o, plain_o, kFp32OutAtol, kFp32OutRtol, atol_for(dtype), name);
      expect_matches("lse", dtype, got_l, ref_l, plain_l, kFp32LseAtol, kFp32LseRtol, kLseAtol, name);
    }
  }
}

// Every key hides from rows [40, 75) (they span query blocks and cut two): those rows get out 0,
// lse -inf and dq 0 exactly, and take no part in dk and dv; every other row sees every key, so its
// results are the unmasked call's (expect_masked_results: the 2x rule on every output).
TEST(CpuColumnMask, RowsHiddenFromEveryKeyAreFullyMasked) {
  const int64_t sq = 120, sk = 130;
  const HiddenRows hidden{40, 75};
  const Problem call = dense(2, 2, 1, sq, sk, kHeadDim);
  for (const DType dtype : kCpuDtypes) {
    Columns m(2, 1, sk, 2);
    for (int64_t b = 0; b < 2; ++b) hide_rows_from_every_key(m, b, 0, hidden.lo, hidden.hi);
    HostCase c = fresh_case(call, dtype);
    c.out.poison();
    c.lse.poison();
    const ForwardArgs f = masked_forward_args(c, m, /*causal=*/false);
    forward(f);
    run_masked_backward(c, f);
    expect_masked_results(c, call, hidden, atol_for(dtype), kLseAtol);
  }
}

// Spans that fall with the key (key j seen by rows [s - 1 - j, s)): a later key block reaches
// further back, the order of blocks that the GPU's deterministic backward cannot skip. Against
// causal attention over K and V in reverse row order (reversed_causal_references), under both of
// the backward's plans.
TEST(CpuColumnMask, SpansThatFallWithTheKeyMatchCausalOverReversedKeys) {
  const int64_t s = 150;
  for (const DType dtype : kCpuDtypes) {
    Columns m(1, 1, s, 1);
    hide_before_the_reversed_diagonal(m, 0, 0);
    HostCase c = fresh_case(dense(1, 4, 2, s, s, kHeadDim), dtype);
    c.out.poison();
    c.lse.poison();
    const ForwardArgs f = masked_forward_args(c, m, /*causal=*/false);
    forward(f);
    run_masked_backward(c, f);
    Tensors ref, plain;
    reversed_causal_references(c, ref, plain);
    const std::string name = case_name(c) + " with spans that fall with the key";
    const double low = atol_for(dtype);
    expect_matches("out", dtype, c.out.to_double(), ref.out, plain.out, kFp32OutAtol, kFp32OutRtol, low, name);
    expect_matches("lse", dtype, c.lse.to_double(), ref.lse, plain.lse, kFp32LseAtol, kFp32LseRtol, kLseAtol, name);
    expect_matches("dq", dtype, c.dq.to_double(), ref.dq, plain.dq, kFp32GradAtol, kFp32GradRtol, low, name);
    expect_matches("dk", dtype, c.dk.to_double(), ref.dk, plain.dk, kFp32GradAtol, kFp32GradRtol, low, name);
    expect_matches("dv", dtype, c.dv.to_double(), ref.dv, plain.dv, kFp32GradAtol, kFp32GradRtol, low, name);
  }
}

TEST(CpuColumnMask, MalformedMasksAreRejectedByName) {
  HostCase c = fresh_case(dense(2, 4, 2, 16, 24, kHeadDim), DType::kFloat32);
  const auto message = [&](Columns& m, TensorView view) {
    ForwardArgs a = masked_forward_args(c, m, false);
    a.options.column_mask = view;
    try {
      forward(a);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Columns good(2, 4, 24, 1), two_heads(2, 2, 24, 1), short_keys(2, 1, 23, 1), three(2, 1, 24, 1);
  EXPECT_NE(message(two_heads, two_heads.view()).find("column_mask"), std::string::npos);
  EXPECT_NE(message(short_keys, short_keys.view()).find("must be an int32 [2, 1 or 4, 24, 2 or 4] tensor"),
            std::string::npos);
  TensorView odd = three.view();
  odd.shape[3] = 3;
  EXPECT_NE(message(three, odd).find("column_mask"), std::string::npos);
  TensorView floats = good.view();
  floats.dtype = DType::kFloat32;
  EXPECT_NE(message(good, floats).find("column_mask: must be int32"), std::string::npos);
  TensorView strided = good.view();
  strided.stride[3] = 2;
  EXPECT_NE(message(good, strided).find("each key's bounds must be contiguous"), std::string::npos);
  TensorView backwards = good.view();  // the keys from the last: a stride the API turns down
  backwards.data = static_cast<int32_t*>(backwards.data) + (backwards.shape[2] - 1) * backwards.stride[2];
  backwards.stride[2] = -backwards.stride[2];
  EXPECT_NE(message(good, backwards).find("column_mask: negative stride"), std::string::npos);
  // Variable-length calls do not take it.
  HostCase v = fresh_case(packed(2, 1, kHeadDim, {5, 7}, {5, 7}), DType::kFloat32);
  Columns m(2, 1, 7, 1);
  ForwardArgs a = forward_args(v);
  a.options.column_mask = m.view();
  try {
    forward(a);
    ADD_FAILURE() << "a variable-length call took a column mask";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("column_mask: is supported on dense calls only"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fusedattn::testing
