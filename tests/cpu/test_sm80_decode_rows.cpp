// The portable forward's view of a grouped decode (src/cuda/sm80/decode_rows.h): the query heads
// of a KV head become rows of one head. A host rule, checked here without a GPU: which launches
// take the view, and that every (head, row) of the view addresses the original element. The GPU
// side runs in Sm80Forward.DecodeGroupsReadAsRows.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm80/decode_rows.h"
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
  float lse = 0.f;
  p.lse = &lse;  // only compared against null
  fold_unbounded_window(p);
  return p;
}

TEST(Sm80DecodeRows, GroupsBecomeRowsOfTheirKvHead) {
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

TEST(Sm80DecodeRows, OtherLaunchesRunAsTheyAre) {
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

}  // namespace
}  // namespace fusedattn::cuda::sm80
