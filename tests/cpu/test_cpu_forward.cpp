// CPU forward against the float64 reference over the feature matrix: lengths that are not block
// multiples, Sq != Sk both ways, causal and windows, GQA/MQA, varlen with empty sequences, both
// layouts, head dims 1..256. Every test runs fp32, fp16 and bf16 on fresh inputs.
#include <gtest/gtest.h>

#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kDefaultHeadDim = 64;

void check_all_dtypes(const Problem& p, Layout layout = Layout::kBSHD) {
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
    check_forward(p, dtype, layout);
  }
}

TEST(CpuForward, SeqlensNotMultipleOf64) {
  for (int64_t s : {1, 17, 100, 257}) check_all_dtypes(dense(2, 2, 2, s, s, kDefaultHeadDim));
}

TEST(CpuForward, SqLongerThanSk) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{100, 17}, {257, 1}, {65, 64}}) {
    check_all_dtypes(dense(2, 2, 2, sq, sk, kDefaultHeadDim));
    check_all_dtypes(with_mask(dense(2, 2, 2, sq, sk, kDefaultHeadDim), true, -1, -1));
  }
}

TEST(CpuForward, SkLongerThanSq) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{17, 100}, {1, 257}, {64, 129}}) {
    check_all_dtypes(dense(2, 2, 2, sq, sk, kDefaultHeadDim));
    check_all_dtypes(with_mask(dense(2, 2, 2, sq, sk, kDefaultHeadDim), true, -1, -1));
  }
}

TEST(CpuForward, CausalSquare) {
  for (int64_t s : {1, 63, 64, 130}) check_all_dtypes(with_mask(dense(2, 3, 3, s, s, kDefaultHeadDim), true, -1, -1));
}

TEST(CpuForward, CausalWithExplicitZeroRightWindow) {
  // causal with window_right = 0 spelled out is the same mask, and is accepted.
  check_all_dtypes(with_mask(dense(1, 2, 2, 70, 90, kDefaultHeadDim), true, -1, 0));
}

TEST(CpuForward, WindowLeftOnly) {
  check_all_dtypes(with_mask(dense(2, 2, 2, 100, 100, kDefaultHeadDim), false, 16, -1));
  check_all_dtypes(with_mask(dense(1, 2, 2, 40, 130, kDefaultHeadDim), false, 0, -1));
  check_all_dtypes(with_mask(dense(1, 2, 2, 130, 40, kDefaultHeadDim), false, 7, -1));
}

TEST(CpuForward, WindowRightOnly) {
  check_all_dtypes(with_mask(dense(2, 2, 2, 100, 100, kDefaultHeadDim), false, -1, 5));
  check_all_dtypes(with_mask(dense(1, 2, 2, 40, 130, kDefaultHeadDim), false, -1, 0));
  // Sq > Sk with a short right window: the first rows see no key at all.
  check_all_dtypes(with_mask(dense(1, 2, 2, 130, 40, kDefaultHeadDim), false, -1, 3));
}

TEST(CpuForward, WindowBothSides) {
  check_all_dtypes(with_mask(dense(2, 2, 2, 100, 100, kDefaultHeadDim), false, 8, 8));
  check_all_dtypes(with_mask(dense(1, 2, 2, 77, 200, kDefaultHeadDim), false, 64, 1));
  check_all_dtypes(with_mask(dense(1, 2, 2, 200, 77, kDefaultHeadDim), false, 3, 70));
  // Causal plus a left window: the sliding-window attention of local models.
  check_all_dtypes(with_mask(dense(1, 2, 2, 150, 150, kDefaultHeadDim), true, 32, -1));
  // A zero-width window: each row sees exactly its diagonal key.
  check_all_dtypes(with_mask(dense(1, 2, 2, 50, 50, kDefaultHeadDim), false, 0, 0));
}

TEST(CpuForward, GroupedQueryAttention) {
  check_all_dtypes(dense(2, 8, 2, 70, 90, kDefaultHeadDim));
  check_all_dtypes(with_mask(dense(2, 6, 3, 90, 70, kDefaultHeadDim), true, -1, -1));
}

// One query row per sequence with grouped heads runs as the group's rows of its KV head
// (params.h, decode_groups_as_rows): full and causal masks (one row: the same keys), both
// layouts, MQA; a window and a packed batch, which the view does not take, alongside.
TEST(CpuForward, GroupedDecode) {
  for (int64_t sk : {1, 70, 300}) {
    check_all_dtypes(dense(3, 8, 2, 1, sk, kDefaultHeadDim));
    check_all_dtypes(with_mask(dense(2, 8, 2, 1, sk, kDefaultHeadDim), true, -1, -1), Layout::kBHSD);
    check_all_dtypes(dense(2, 6, 1, 1, sk, 40), Layout::kBHSD);
    check_all_dtypes(with_mask(dense(2, 8, 2, 1, sk, kDefaultHeadDim), false, 40, 0));
  }
  check_all_dtypes(packed(8, 2, kDefaultHeadDim, {1, 1, 1}, {90, 0, 300}));
}

// Few tasks over many keys split each task's keys into parts (forward.cpp, key_parts): decode
// with and without grouped heads (a one-row causal mask is full), a few query rows, key counts
// that end inside a tile, a packed batch whose short sequences have parts without keys and one
// sequence with no key at all; a window alongside, which does not split.
TEST(CpuForward, KeySplitDecode) {
  check_all_dtypes(dense(1, 8, 2, 1, 5000, kDefaultHeadDim));
  check_all_dtypes(with_mask(dense(1, 4, 4, 1, 3001, 40), true, -1, -1), Layout::kBHSD);
  check_all_dtypes(dense(2, 2, 1, 5, 2100, kDefaultHeadDim));
  check_all_dtypes(packed(4, 2, kDefaultHeadDim, {1, 1, 2, 1}, {4100, 70, 2000, 0}));
  Problem used = packed(4, 4, kDefaultHeadDim, {1, 1}, {3000, 3000});
  used.seqused_k = {2999, 0};
  check_all_dtypes(used);
  check_all_dtypes(with_mask(dense(1, 8, 2, 1, 3000, kDefaultHeadDim), false, 700, 0));
}

TEST(CpuForward, MultiQueryAttention) {
  check_all_dtypes(dense(2, 4, 1, 70, 90, kDefaultHeadDim));
  check_all_dtypes(with_mask(dense(1, 5, 1, 100, 100, kDefaultHeadDim), false, 10, 2));
}

TEST(CpuForward, VarlenWithEmptySequences) {
  // Length 0 on the query side (sequence 1), on the key side (sequence 2: its rows are fully
  // masked), and on both (sequence 4).
  const Problem p = packed(4, 2, kDefaultHeadDim, {17, 0, 64, 100, 0, 1}, {33, 5, 0, 100, 0, 70});
  check_all_dtypes(p);
  check_all_dtypes(with_mask(p, true, -1, -1));
  check_all_dtypes(with_mask(p, false, 9, 4));
}

TEST(CpuForward, VarlenSingleSequenceMatchesDense) {
  check_all_dtypes(packed(2, 2, kDefaultHeadDim, {129}, {129}));
  check_all_dtypes(with_mask(packed(3, 1, kDefaultHeadDim, {1, 200, 65}, {300, 2, 65}), true, -1, -1));
}

TEST(CpuForward, LayoutBHSD) {
  check_all_dtypes(dense(2, 4, 2, 100, 77, kDefaultHeadDim), Layout::kBHSD);
  check_all_dtypes(with_mask(dense(2, 2, 1, 77, 100, kDefaultHeadDim), true, -1, -1), Layout::kBHSD);
  check_all_dtypes(with_mask(dense(1, 3, 3, 90, 90, kDefaultHeadDim), false, 20, 5), Layout::kBHSD);
}

TEST(CpuForward, HeadDims) {
  for (int d : {1, 8, 40, 64, 80, 128, 256}) {
    check_all_dtypes(dense(1, 2, 1, 67, 90, d));
    check_all_dtypes(with_mask(dense(1, 2, 2, 90, 67, d), true, -1, -1), Layout::kBHSD);
  }
}

TEST(CpuForward, ExplicitSoftmaxScale) {
  Problem p = dense(2, 2, 2, 50, 60, kDefaultHeadDim);
  p.softmax_scale = 0.5f;
  check_all_dtypes(p);
  p.softmax_scale = -0.03f;  // negative scales are legal: softmax of the negated scores
  check_all_dtypes(p);
}

TEST(CpuForward, LseMayBeOmitted) {
  // The second problem is a grouped decode, which runs as rows of its KV heads.
  for (const Problem& p : {with_mask(dense(2, 2, 2, 80, 80, kDefaultHeadDim), true, -1, -1),
                           dense(2, 8, 2, 1, 150, kDefaultHeadDim)}) {
    for (DType dtype : kCpuDtypes) {
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      c.out.poison();
      ForwardArgs a = forward_args(c);
      a.lse = TensorView{};
      forward(a);
      Tensors ref = c.values, plain = c.values;
      reference_forward(p, ref);
      plain_forward(p, dtype, plain);
      expect_matches("out", dtype, c.out.to_double(), ref.out, plain.out, kFp32OutAtol, kFp32OutRtol,
                     atol_for(dtype), case_name(c));
    }
  }
}

TEST(CpuForward, SingleThreadAndManyThreads) {
  // The API's num_threads: 1 and more threads than there is work must both be correct (the second
  // problem splits its keys; CpuDeterminism checks that the bits do not change either).
  for (const Problem& p : {with_mask(dense(2, 3, 1, 130, 70, kDefaultHeadDim), true, -1, -1),
                           dense(1, 8, 2, 1, 4500, kDefaultHeadDim)}) {
    for (int threads : {1, 3, 64}) {
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, DType::kFloat32, Layout::kBSHD, rng);
      c.out.poison();
      c.lse.poison();
      ForwardArgs a = forward_args(c);
      a.options.num_threads = threads;
      forward(a);
      Tensors ref = c.values;
      reference_forward(p, ref);
      EXPECT_TRUE(all_close(c.out.to_double(), ref.out, kFp32OutAtol, kFp32OutRtol))
          << threads << " threads, " << p.str();
      EXPECT_TRUE(all_close(c.lse.to_double(), ref.lse, kFp32LseAtol, kFp32LseRtol))
          << threads << " threads, " << p.str();
    }
  }
}

}  // namespace
}  // namespace fusedattn::testing
