// merge_attention on the CPU backend (fusedattn/merge.h): the attention over both key sets within
// the 2x rule for every pair of dtypes, dense and varlen, over strided slices of longer tensors;
// rows without keys on either side; a NaN LSE kept; every malformed argument rejected by name.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "fusedattn/merge.h"
#include "reference/merge_case.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

constexpr DType kFloatDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

void expect_merged(const MergeShape& shape, DType out_dtype, DType part_dtype, int threads = 0) {
  std::mt19937_64 rng = fresh_rng();
  MergeCase c(shape, out_dtype, part_dtype, rng);
  MergeArgs a = c.args([](HostTensor& t) { return t.view(); });
  a.num_threads = threads;
  merge_attention(a);
  EXPECT_TRUE(c.check()) << "out " << dtype_name(out_dtype) << ", part_out " << dtype_name(part_dtype);
}

TEST(CpuMerge, EveryPairOfDtypesMatchesTheAttentionOverBothKeySets) {
  // 2 x 50 x 3 rows: several of the backend's tasks of rows.
  for (DType out : kFloatDtypes)
    for (DType part : kFloatDtypes) expect_merged({2, 50, 3, 40}, out, part);
}

TEST(CpuMerge, SlicesOfLongerTensorsDenseVarlenAndHeadsFirst) {
  expect_merged({.batch = 2, .seqlen = 9, .heads = 3, .dim = 24, .rows_around = 4}, DType::kFloat32,
                DType::kFloat16);
  expect_merged({.batch = 1, .seqlen = 13, .heads = 2, .dim = 16, .varlen = true, .rows_around = 5},
                DType::kFloat32, DType::kBFloat16);
  expect_merged({.batch = 2, .seqlen = 7, .heads = 4, .dim = 32, .rows_around = 3, .layout = Layout::kBHSD},
                DType::kBFloat16, DType::kBFloat16, 1);
}

TEST(CpuMerge, OddHeadDimsAndNoHeadDim) {
  expect_merged({1, 11, 2, 6}, DType::kFloat32, DType::kFloat16);
  expect_merged({2, 5, 3, 1}, DType::kFloat16, DType::kFloat32);
  expect_merged({1, 3, 2, 300}, DType::kBFloat16, DType::kFloat16);  // rows longer than the backend's chunk
  expect_merged({2, 5, 3, 0}, DType::kFloat32, DType::kFloat32);  // only the LSEs merge
}

// A NaN LSE on either side makes the row NaN (out and LSE), and leaves the other rows as the
// same merge without it gives them (that merge checked against the reference).
TEST(CpuMerge, ANanLseMakesItsRowNan) {
  std::mt19937_64 rng = fresh_rng();
  const auto view = [](HostTensor& t) { return t.view(); };
  const auto same = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  for (bool in_part : {false, true}) {
    std::mt19937_64 twin = rng;
    MergeCase c({1, 4, 1, 8}, DType::kFloat32, DType::kFloat32, rng), clean({1, 4, 1, 8}, DType::kFloat32,
                                                                            DType::kFloat32, twin);
    HostTensor& poisoned = in_part ? c.part_lse : c.lse;
    static_cast<float*>(poisoned.data())[2] = NAN;
    merge_attention(c.args(view));
    merge_attention(clean.args(view));
    EXPECT_TRUE(clean.check());
    const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
    const std::vector<double> clean_out = clean.out.to_double(), clean_lse = clean.lse.to_double();
    EXPECT_TRUE(std::isnan(lse[2])) << in_part;
    for (int d = 0; d < 8; ++d) EXPECT_TRUE(std::isnan(out[2 * 8 + d])) << in_part;
    for (int d = 0; d < 8; ++d) EXPECT_FALSE(std::isnan(out[1 * 8 + d])) << "row 1 has keys on both sides";
    for (int row : {0, 1, 3}) {
      EXPECT_TRUE(same(lse[row], clean_lse[row])) << "row " << row << " " << in_part;
      for (int d = 0; d < 8; ++d) EXPECT_TRUE(same(out[row * 8 + d], clean_out[row * 8 + d])) << "row " << row;
    }
  }
}

TEST(CpuMerge, RejectsMalformedArgumentsByName) {
  std::mt19937_64 rng = fresh_rng();
  MergeCase c({2, 5, 3, 8}, DType::kFloat32, DType::kFloat16, rng);
  const MergeArgs good = c.args([](HostTensor& t) { return t.view(); });
  merge_attention(good);  // the unchanged arguments are accepted
  std::vector<float> other(64);
  // Each malformed variant of the arguments, the error code and argument it must name, and what
  // its message must mention.
  struct Bad {
    std::function<void(MergeArgs&)> spoil;
    ErrorCode code;
    const char* argument;
    const char* mentions;
  };
  const std::vector<Bad> cases = {
      {[](MergeArgs& x) { x.out.rank = 2; }, ErrorCode::kShapeMismatch, "out", "rank 3 [total, heads, head_dim]"},
      {[](MergeArgs& x) { x.part_out.shape[2] = 2; }, ErrorCode::kShapeMismatch, "part_out", "must equal out's"},
      {[](MergeArgs& x) { x.part_out.rank = 3; }, ErrorCode::kShapeMismatch, "part_out", "expected rank 4"},
      {[](MergeArgs& x) { x.lse.shape[2] = 4; }, ErrorCode::kShapeMismatch, "lse", "[2, 3, 5]"},
      {[](MergeArgs& x) { x.part_lse.shape[0] = 1; }, ErrorCode::kShapeMismatch, "part_lse", "[2, 3, 5]"},
      {[](MergeArgs& x) { x.lse.dtype = DType::kFloat16; }, ErrorCode::kDtypeMismatch, "lse", "fp32"},
      {[](MergeArgs& x) { x.part_lse.dtype = DType::kBFloat16; }, ErrorCode::kDtypeMismatch, "part_lse", "fp32"},
      {[](MergeArgs& x) { x.out.dtype = DType::kInt32; }, ErrorCode::kDtypeMismatch, "out", "fp32, fp16 or bf16"},
      {[](MergeArgs& x) { x.part_out.dtype = DType::kFloat8E4M3; }, ErrorCode::kDtypeMismatch, "part_out",
       "fp32, fp16 or bf16"},
      {[](MergeArgs& x) { x.out.stride[3] = 2; }, ErrorCode::kLayout, "out", "contiguous"},
      {[](MergeArgs& x) { x.lse.stride[1] = 0; }, ErrorCode::kLayout, "lse", "stride 0"},
      {[](MergeArgs& x) { x.out.stride[2] = 0; }, ErrorCode::kLayout, "out", "stride 0"},
      // Heads 4 elements apart over 8-wide rows: each head's last 4 are the next one's first.
      {[](MergeArgs& x) { x.out.stride[2] = 4; }, ErrorCode::kLayout, "out", "overlaps"},
      {[](MergeArgs& x) { x.lse.stride[2] = 6; }, ErrorCode::kLayout, "lse", "overlaps"},
      {[](MergeArgs& x) { x.lse.stride[2] = -1; }, ErrorCode::kLayout, "lse", "negative stride"},
      {[](MergeArgs& x) { x.part_lse.stride[0] = -1; }, ErrorCode::kLayout, "part_lse", "negative stride"},
      {[](MergeArgs& x) { x.part_out.data = nullptr; }, ErrorCode::kInvalidArgument, "part_out", "null"},
      {[](MergeArgs& x) { x.part_out.device = {DeviceType::kCUDA, 0}; }, ErrorCode::kDeviceMismatch, "part_out",
       "out's device"},
      {[](MergeArgs& x) { x.lse.device = {DeviceType::kCUDA, 0}; }, ErrorCode::kDeviceMismatch, "lse",
       "out's device"},
      // The other side's tensors over out's or lse's memory, other than as those very views (each
      // inside the other's buffer, so that nothing else can meet it): part_out's fp16 elements over
      // out's fp32 ones, part_lse as each row's first lse repeated.
      {[](MergeArgs& x) { x.part_out.data = x.out.data; }, ErrorCode::kLayout, "out", "shares memory with part_out"},
      {[](MergeArgs& x) {
         x.part_lse = x.lse;
         x.part_lse.stride[2] = 0;
       },
       ErrorCode::kLayout, "lse", "shares memory with part_lse"},
      {[](MergeArgs& x) { x.lse.data = x.out.data; }, ErrorCode::kLayout, "lse",
       "shares memory with out, which the call also writes"},
      {[&](MergeArgs& x) {  // a varlen out with a dense LSE
         x.out = TensorView::contiguous(other.data(), DType::kFloat32, {4, 2, 8});
         x.part_out = x.out;
       },
       ErrorCode::kShapeMismatch, "lse", "expected rank 2 [heads, total]"},
  };
  for (const Bad& bad : cases) {
    MergeArgs a = good;
    bad.spoil(a);
    expect_error([&] { merge_attention(a); }, bad.code, bad.argument, bad.mentions);
  }
}

// The other side may be out and lse themselves: each element is read before it is written. The
// merge of attention with itself keeps out and adds log 2 to the LSE (a row without keys stays
// one: out 0, lse -inf).
TEST(CpuMerge, TheOtherSideMayBeOutAndLseThemselves) {
  std::mt19937_64 rng = fresh_rng();
  HostTensor out(DType::kFloat32, {2, 5, 3, 8}), lse(DType::kFloat32, {2, 3, 5});
  out.fill(randn(rng, out.numel(), 1.0, DType::kFloat32));
  std::vector<double> lse_in = randn(rng, lse.numel(), 2.0, DType::kFloat32);
  lse_in[7] = -INFINITY;
  lse.fill(lse_in);
  const std::vector<double> out_in = out.to_double();
  MergeArgs a;
  a.out = a.part_out = out.view();
  a.lse = a.part_lse = lse.view();
  merge_attention(a);
  const std::vector<double> out_got = out.to_double(), lse_got = lse.to_double();
  for (size_t i = 0; i < lse_in.size(); ++i)
    if (std::isinf(lse_in[i]))
      EXPECT_EQ(lse_got[i], -INFINITY) << i;
    else
      EXPECT_NEAR(lse_got[i], lse_in[i] + std::log(2.0), 1e-5) << i;
  // lse row 7 is batch 0, head 1, row 2: its output is [0, 2, 1, :].
  for (int64_t b = 0, i = 0; b < 2; ++b)
    for (int64_t s = 0; s < 5; ++s)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t d = 0; d < 8; ++d, ++i) {
          const bool keyless = b == 0 && h == 1 && s == 2;
          if (keyless)
            EXPECT_EQ(out_got[i], 0.0) << i;
          else
            EXPECT_NEAR(out_got[i], out_in[i], 1e-6 * (1 + std::fabs(out_in[i]))) << i;
        }
}

// A call with no row writes nothing and reads no data pointer.
TEST(CpuMerge, NoRowIsANoOp) {
  MergeArgs a;
  a.out = TensorView::contiguous(nullptr, DType::kFloat32, {0, 5, 2, 8});
  a.part_out = a.out;
  a.lse = TensorView::contiguous(nullptr, DType::kFloat32, {0, 2, 5});
  a.part_lse = a.lse;
  merge_attention(a);
}

}  // namespace
}  // namespace fusedattn::testing
