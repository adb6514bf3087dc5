// The decode rules, checked here without a GPU: the view of a grouped decode (params.h,
// decode_groups_as_rows: the query heads of a KV head become rows of one head; which launches
// take it, and that every (head, row) of the view addresses the original element), which the CPU
// backend and the portable CUDA forward apply, and the portable forward's key split parts
// (src/cuda/sm80/fwd_kv_split.h). The runs: CpuForward.GroupedDecode,
// Sm80Forward.DecodeGroupsReadAsRows and Sm80Forward.KeySplit*.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm80/fwd_kv_split.h"
#include "fusedattn/params.h"
#include "reference/problems.h"

namespace fusedattn::cuda::sm80 {
namespace {

// One decode query per sequence over 300 keys, 8 query heads on kv_heads, BSHD strides.
FwdParams decode(int kv_heads) {
  FwdParams p;
  testing::set_shape(p, testing::dense(3, 8, kv_heads, 1, 300, 64));
  p.q_stride = p.o_stride = {8 * 64, 8 * 64, 64};
  p.lse_batch_stride = 8;
  p.lse_head_stride = 1;
  static float lse_storage;  // the rule only tests p.lse against null
  p.lse = &lse_storage;
  fold_unbounded_window(p);
  return p;
}

TEST(DecodeRows, GroupsBecomeRowsOfTheirKvHead) {
  const FwdParams p = decode(2);
  const FwdParams r = decode_groups_as_rows(p);
  ASSERT_EQ(r.seqlen_q, 4);
  ASSERT_EQ(r.heads_q, 2);
  EXPECT_EQ(r.heads_kv, 2);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h) {
      const int kv = h / 4, row = h % 4;
      EXPECT_EQ(b * r.q_stride.batch + row * r.q_stride.row + kv * r.q_stride.head,
                b * p.q_stride.batch + h * p.q_stride.head);
      EXPECT_EQ(b * r.o_stride.batch + row * r.o_stride.row + kv * r.o_stride.head,
                b * p.o_stride.batch + h * p.o_stride.head);
      EXPECT_EQ(b * r.lse_batch_stride + kv * r.lse_head_stride + row, b * p.lse_batch_stride + h * p.lse_head_stride);
    }
}

TEST(DecodeRows, OtherLaunchesRunAsTheyAre) {
  const auto unchanged = [](const FwdParams& p) { return decode_groups_as_rows(p).seqlen_q == p.seqlen_q; };
  EXPECT_TRUE(unchanged(decode(8)));  // no group
  FwdParams causal = decode(2);
  causal.window_right = 0;
  fold_unbounded_window(causal);  // one row: causal is the full mask
  EXPECT_FALSE(unchanged(causal));
  FwdParams window = decode(2);
  window.window_left = 100;  // the rows would see different keys once they are rows
  EXPECT_TRUE(unchanged(window));
  FwdParams two_rows = decode(2);
  two_rows.seqlen_q = 2;
  EXPECT_TRUE(unchanged(two_rows));
  FwdParams strided_lse = decode(2);
  strided_lse.lse_head_stride = 5;
  EXPECT_TRUE(unchanged(strided_lse));
  strided_lse.lse = nullptr;  // not written: any stride
  EXPECT_FALSE(unchanged(strided_lse));
  FwdParams varlen = decode(2);
  const int32_t offsets[4] = {0, 1, 2, 3};
  varlen.cu_seqlens_q = varlen.cu_seqlens_k = offsets;
  EXPECT_TRUE(unchanged(varlen));
}

// Parts fill the slots a launch leaves idle, each with at least kMinKeysPerPart keys, at most
// kMaxKvParts; launches that fill the GPU, or whose rows see few keys, run whole.
TEST(Sm80KvSplit, PartsFillTheIdleSlots) {
  constexpr int64_t kSlots = 264;  // 132 SMs, two CTAs each
  EXPECT_EQ(kv_split_parts(8, 32768, kSlots), kMaxKvParts);     // decode, batch 1, 8 KV heads
  EXPECT_EQ(kv_split_parts(8, 4096, kSlots), 4096 / kMinKeysPerPart);
  EXPECT_EQ(kv_split_parts(128, 32768, kSlots), 2);             // batch 16
  EXPECT_EQ(kv_split_parts(200, 32768, kSlots), 1);             // more than half the slots
  EXPECT_EQ(kv_split_parts(264, 32768, kSlots), 1);
  EXPECT_EQ(kv_split_parts(2, 2 * kMinKeysPerPart - 1, kSlots), 1);  // too few keys for two parts
  EXPECT_EQ(kv_split_parts(2, 2 * kMinKeysPerPart, kSlots), 2);
  EXPECT_EQ(kv_split_parts(0, 32768, kSlots), 1);
  for (int64_t ctas : {1, 3, 50, 131})
    for (int64_t keys : {1, 700, 5000, 1 << 20}) {
      const int parts = kv_split_parts(ctas, keys, kSlots);
      EXPECT_GE(parts, 1);
      EXPECT_LE(parts, kMaxKvParts);
      EXPECT_LE(ctas * parts, kSlots);
      if (parts > 1) EXPECT_GE(keys / parts, kMinKeysPerPart);
    }
}

}  // namespace
}  // namespace fusedattn::cuda::sm80
