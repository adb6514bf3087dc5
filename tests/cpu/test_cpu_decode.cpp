// Decode steps on the CPU backend: one query row per sequence and head, with K/V rows of a key's
// heads side by side, which src/cpu/decode.cpp reads key by key (every head of a sequence in one
// task, keys split into parts where sequences are few; large groups of short key rows stay on the
// tiled forward). Against the float64 reference (fp32 tolerance or the 2x rule): MHA, GQA and MQA
// (on either path), head dims that are and are not whole vectors, key counts around the 4-key
// steps, the 64-key tiles and the 1024-key parts, windows, variable-length batches with empty
// sequences and seqused_k, and the layouts the path does not take.
#include <gtest/gtest.h>

#include <string>

#include "cpu/cpu_check.h"
#include "cpu/decode.h"

namespace fusedattn::testing {
namespace {

using cpu::FUSEDATTN_CPU_ISA::decodes_by_key_rows;

void check_all_dtypes(const Problem& p, Layout layout = Layout::kBSHD) {
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype) + (layout == Layout::kBHSD ? " BHSD" : ""));
    check_forward(p, dtype, layout);
  }
}

TEST(CpuDecode, HeadGroupsAndKeyCountsMatchTheReference) {
  struct Heads {
    int q, kv;
  };
  for (const Heads heads : {Heads{4, 4}, Heads{8, 2}, Heads{8, 1}, Heads{32, 4}})
    for (int64_t keys : {1, 3, 4, 5, 63, 64, 67, 300, 2100})
      check_all_dtypes(dense(2, heads.q, heads.kv, 1, keys, 64));
}

TEST(CpuDecode, HeadDimsMatchTheReference) {
  for (int d : {1, 8, 40, 72, 128, 256}) check_all_dtypes(dense(1, 4, 2, 1, 130, d));
}

// Few sequences over many keys: the keys are split into parts, combined in order.
TEST(CpuDecode, SplitKeysMatchTheReference) {
  check_all_dtypes(dense(1, 8, 2, 1, 4500, 64));
  check_all_dtypes(dense(3, 4, 4, 1, 3000, 32));
}

// One query row sees the last keys (bottom-right aligned): a causal mask hides none, a window its
// left part, window_left 0 all but the last key.
TEST(CpuDecode, WindowsMatchTheReference) {
  const Problem p = dense(2, 4, 2, 1, 1500, 64);
  check_all_dtypes(with_mask(p, true, -1, -1));
  check_all_dtypes(with_mask(p, false, 100, 0));
  check_all_dtypes(with_mask(p, true, 0, -1));
}

// Sequences without keys or without a query row give 0 and -inf or no row at all.
TEST(CpuDecode, VariableLengthBatchesMatchTheReference) {
  check_all_dtypes(packed(4, 2, 64, {1, 0, 1, 1}, {300, 50, 0, 2000}));
  Problem used = packed(4, 1, 64, {1, 1, 1}, {200, 1100, 90});
  used.seqused_k = {150, 1100, 0};
  check_all_dtypes(used);
}

// [B, H, S, D] keys keep a head's rows together, not a key's, and large groups of short key rows
// run as rows of one tile: the tiled forward serves them.
TEST(CpuDecode, OtherLayoutsAndLargeGroupsTakeTheTiledForward) {
  check_all_dtypes(dense(2, 8, 2, 1, 300, 64), Layout::kBHSD);
  // The rule itself, on the strides: [B, S, H, D] steps one head by head_dim elements.
  constexpr int kHeadDim = 64;
  constexpr int64_t kKeys = 10;
  FwdParams bshd;
  set_shape(bshd, dense(1, 4, 2, 1, kKeys, kHeadDim));
  bshd.k_stride = bshd.v_stride = {kKeys * 2 * kHeadDim, 2 * kHeadDim, kHeadDim};
  FwdParams bhsd = bshd;
  bhsd.k_stride = bhsd.v_stride = {2 * kKeys * kHeadDim, kHeadDim, kKeys * kHeadDim};
  EXPECT_TRUE(decodes_by_key_rows(bshd));
  EXPECT_FALSE(decodes_by_key_rows(bhsd));
  FwdParams two_rows = bshd;
  two_rows.seqlen_q = 2;
  EXPECT_FALSE(decodes_by_key_rows(two_rows));
  // Large groups of short key rows stay tiled (their query heads are rows of one tile there).
  FwdParams mqa = bshd;
  mqa.heads_q = 32;
  mqa.heads_kv = 1;
  mqa.k_stride = mqa.v_stride = {kKeys * kHeadDim, kHeadDim, kHeadDim};
  mqa.dtype = DType::kFloat16;
  EXPECT_FALSE(decodes_by_key_rows(mqa));
  FwdParams gqa8 = mqa;  // 32 query heads on 4 KV heads, d128 fp32: 2 KiB a key, 256 B per group head
  gqa8.heads_kv = 4;
  gqa8.head_dim = 2 * kHeadDim;
  gqa8.dtype = DType::kFloat32;
  gqa8.k_stride = gqa8.v_stride = {kKeys * 4 * gqa8.head_dim, 4 * gqa8.head_dim, gqa8.head_dim};
  EXPECT_TRUE(decodes_by_key_rows(gqa8));
  gqa8.dtype = DType::kBFloat16;
  EXPECT_FALSE(decodes_by_key_rows(gqa8));
  const int32_t bounds[kKeys * 2] = {};
  FwdParams column = bshd;
  column.column_mask = bounds;
  EXPECT_FALSE(decodes_by_key_rows(column));
}

}  // namespace
}  // namespace fusedattn::testing
