// The CUDA backend through the public API with cudaMalloc'd buffers: the CPU suite's feature
// matrix in fp16 and bf16 (2x rule, every element, outputs poisoned), head dims served directly
// or by the next larger instance, the edges (zero sizes, fully masked rows, large logits, NaN
// confinement), streams, caller workspace, and bit-identical reruns.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "gpu/gpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kHeadDim = 64;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- forward feature matrix ----------------------------------------------------------------------

TEST(GpuForward, SeqlensNotMultipleOfTheBlock) {
  FUSEDATTN_REQUIRE_GPU();
  for (int64_t s : {1, 17, 100, 257}) FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(dense(2, 2, 2, s, s, kHeadDim)));
}

TEST(GpuForward, SqNotEqualSk) {
  FUSEDATTN_REQUIRE_GPU();
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{100, 17}, {257, 1}, {17, 100}, {1, 257}, {65, 300}}) {
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(dense(2, 2, 2, sq, sk, kHeadDim)));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(2, 2, 2, sq, sk, kHeadDim), true, -1, -1)));
  }
}

TEST(GpuForward, Causal) {
  FUSEDATTN_REQUIRE_GPU();
  for (int64_t s : {1, 63, 128, 300}) FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(2, 3, 3, s, s, kHeadDim), true, -1, -1)));
}

TEST(GpuForward, Windows) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(2, 2, 2, 300, 300, kHeadDim), false, 40, -1)));   // left only
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 130, 300, kHeadDim), false, -1, 7)));    // right only
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 300, 130, kHeadDim), false, -1, 3)));    // rows see nothing
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 257, 257, kHeadDim), false, 64, 64)));  // both
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 200, 77, kHeadDim), false, 3, 70)));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 300, 300, kHeadDim), true, 100, -1)));  // local causal
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 100, 100, kHeadDim), false, 0, 0)));     // diagonal only
}

TEST(GpuForward, GqaAndMqa) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(dense(2, 8, 2, 170, 190, kHeadDim)));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(2, 6, 3, 190, 170, kHeadDim), true, -1, -1)));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(dense(1, 5, 1, 100, 250, kHeadDim)));
}

TEST(GpuForward, VarlenWithEmptySequences) {
  FUSEDATTN_REQUIRE_GPU();
  const Problem p = packed(4, 2, kHeadDim, {17, 0, 130, 200, 0, 1}, {33, 5, 0, 260, 0, 70});
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(p));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(p, true, -1, -1)));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(p, false, 20, 4)));
}

// max_seqlen far above the sequences (a model's context length, or any bound up to INT64_MAX):
// validation lowers it to the offsets' rows, so the grids stay sized by the batch, and the
// answer is exact, forward and backward.
TEST(GpuForward, VarlenMaxSeqlenFarAboveTheSequences) {
  FUSEDATTN_REQUIRE_GPU();
  Problem p = with_mask(packed(4, 2, 64, {5, 0, 130}, {7, 3, 200}), true, -1, -1);
  for (const int64_t bound : {int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    p.max_seqlen_bound = bound;
    FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(p));
  }
}

TEST(GpuForward, LayoutBHSD) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(dense(2, 4, 2, 200, 77, kHeadDim), Layout::kBHSD));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(2, 2, 1, 77, 200, kHeadDim), true, -1, -1), Layout::kBHSD));
}

TEST(GpuForward, ExplicitAndNegativeScale) {
  FUSEDATTN_REQUIRE_GPU();
  Problem p = dense(2, 2, 2, 100, 120, kHeadDim);
  p.softmax_scale = 0.5f;
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(p));
  p.softmax_scale = -0.03f;
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(p));
}

TEST(GpuForward, LseMayBeOmitted) {
  FUSEDATTN_REQUIRE_GPU();
  for (DType dtype : kGpuDtypes) {
    std::mt19937_64 rng = fresh_rng();
    const Problem p = with_mask(dense(2, 2, 2, 150, 150, kHeadDim), true, -1, -1);
    HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
    DeviceCase dc(c);
    ForwardArgs a = dc.forward_args();
    a.lse = TensorView{};
    FUSEDATTN_RUN_OR_SKIP(dc.forward(a));
    Tensors ref = c.values, plain = c.values;
    reference_forward(p, ref);
    plain_forward(p, dtype, plain);
    EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(dtype))) << case_name(c);
  }
}

// The call is captured on the caller's stream into a CUDA graph (gpu_util.h, run_captured): work
// the library put on another stream, the legacy one included, would be missing from the graph (or
// fail under the capture), and its results would not be the replay's. A dense call, which reads
// nothing on the host, so that it may be captured.
TEST(GpuForward, RunsOnTheCallersStream) {
  FUSEDATTN_REQUIRE_GPU();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::mt19937_64 rng = fresh_rng();
  const Problem p = with_mask(dense(2, 4, 2, 300, 300, kHeadDim), true, -1, -1);
  HostCase c = make_case(p, DType::kFloat16, Layout::kBSHD, rng);
  DeviceCase dc(c);
  ForwardArgs a = dc.forward_args();
  a.options.stream = stream;
  dc.out.poison();
  dc.lse.poison();
  int kernels = 0;
  const SkipReason skip = run_unless_missing([&] { kernels = run_captured(stream, [&] { forward(a); }); });
  cudaStreamDestroy(stream);
  FUSEDATTN_RUN_OR_SKIP(skip);
  EXPECT_GE(kernels, 1) << "the graph captured on the caller's stream holds no kernel of the call";
  dc.out.download(c.out);
  dc.lse.download(c.lse);
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  plain_forward(p, c.dtype, plain);
  EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(c.dtype)));
  EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse";
}

// q, k, v as views into one packed QKV buffer and out written through padded rows: strides that
// are multiples of 8 elements but not those of a dense tensor.
TEST(GpuForward, PackedQkvAndPaddedOut) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr int B = 2, S = 200, H = 4, D = kHeadDim;
  constexpr int kOutPad = 24;  // elements after every out row (a multiple of 8: still aligned)
  const Problem p = with_mask(dense(B, H, H, S, S, D), true, 60, -1);
  for (DType dtype : kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937_64 rng = fresh_rng();
    HostTensor qkv(dtype, {B, S, 3 * H, D});
    qkv.fill(randn(rng, qkv.numel(), 1.0, dtype));
    HostTensor out(dtype, {B, S, H * D + kOutPad, 1});
    HostTensor lse(DType::kFloat32, lse_shape(p));
    DeviceTensor d_qkv(qkv), d_out(out), d_lse(lse);
    d_out.poison();
    d_lse.poison();
    const int64_t row = 3 * H * D, out_row = H * D + kOutPad;
    ForwardArgs a;
    a.q = strided_view(qkv, 0, {B, S, H, D}, {S * row, row, D, 1}, d_qkv.data(), kGpu);
    a.k = strided_view(qkv, H * D, {B, S, H, D}, {S * row, row, D, 1}, d_qkv.data(), kGpu);
    a.v = strided_view(qkv, 2 * H * D, {B, S, H, D}, {S * row, row, D, 1}, d_qkv.data(), kGpu);
    a.out = strided_view(out, 0, {B, S, H, D}, {S * out_row, out_row, D, 1}, d_out.data(), kGpu);
    a.lse = d_lse.view(lse);
    a.options = options_for(p);
    FUSEDATTN_RUN_OR_SKIP(run_unless_missing([&] { forward(a); }));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    d_out.download(out);
    d_lse.download(lse);
    Tensors t;
    t.q = gather_dense(strided_view(qkv, 0, {B, S, H, D}, {S * row, row, D, 1}));
    t.k = gather_dense(strided_view(qkv, H * D, {B, S, H, D}, {S * row, row, D, 1}));
    t.v = gather_dense(strided_view(qkv, 2 * H * D, {B, S, H, D}, {S * row, row, D, 1}));
    Tensors ref = t, plain = t;
    reference_forward(p, ref);
    plain_forward(p, dtype, plain);
    const auto got = gather_dense(strided_view(out, 0, {B, S, H, D}, {S * out_row, out_row, D, 1}));
    EXPECT_TRUE(obeys_2x_rule(got, plain.out, ref.out, atol_for(dtype))) << "out";
    EXPECT_TRUE(obeys_2x_rule(lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse";
    const auto out_all = out.to_double();
    for (int64_t r = 0; r < int64_t{B} * S; ++r)
      for (int k = 0; k < kOutPad; ++k) ASSERT_TRUE(std::isnan(out_all[r * out_row + H * D + k])) << "out padding written";
  }
}

// ---- head dims ---------------------------------------------------------------------------------

// 40 and 80 have no instance of their own: they run on the next larger one (64, 96) with the
// extra columns masked, which is what these cases check.
class GpuHeadDim : public ::testing::TestWithParam<int> {};

TEST_P(GpuHeadDim, Forward) {
  FUSEDATTN_REQUIRE_GPU();
  const int d = GetParam();
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(dense(1, 2, 1, 167, 190, d)));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(dense(1, 2, 2, 190, 167, d), true, -1, -1), Layout::kBHSD));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(2, 1, d, {70, 0, 129}, {1, 50, 129}), false, 30, 0)));
}

TEST_P(GpuHeadDim, Backward) {
  FUSEDATTN_REQUIRE_GPU();
  const int d = GetParam();
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(dense(1, 2, 1, 130, 150, d)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 150, 130, d), true, -1, -1), Layout::kBHSD));
}

INSTANTIATE_TEST_SUITE_P(All, GpuHeadDim, ::testing::Values(32, 40, 64, 80, 96, 128, 192, 256),
                         [](const ::testing::TestParamInfo<int>& info) { return "d" + std::to_string(info.param); });

// ---- backward feature matrix --------------------------------------------------------------------

TEST(GpuBackward, SeqlensNotMultipleOfTheBlock) {
  FUSEDATTN_REQUIRE_GPU();
  for (int64_t s : {1, 17, 100, 257}) FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(dense(2, 2, 2, s, s, kHeadDim)));
}

TEST(GpuBackward, SqNotEqualSk) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(dense(1, 2, 2, 200, 37, kHeadDim)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(dense(1, 2, 2, 37, 200, kHeadDim)));
}

TEST(GpuBackward, Causal) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(2, 2, 2, 257, 257, kHeadDim), true, -1, -1)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 90, 200, kHeadDim), true, -1, -1)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 200, 90, kHeadDim), true, -1, -1)));
}

TEST(GpuBackward, Windows) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 300, 300, kHeadDim), false, 50, -1)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 170, 300, kHeadDim), false, -1, 6)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 300, 170, kHeadDim), false, 5, 9)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(1, 2, 2, 300, 300, kHeadDim), true, 70, -1)));
}

TEST(GpuBackward, GqaAndMqaSumOverTheGroup) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(dense(1, 8, 2, 160, 170, kHeadDim)));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(dense(2, 4, 1, 170, 160, kHeadDim), true, -1, -1)));
}

TEST(GpuBackward, VarlenWithEmptySequences) {
  FUSEDATTN_REQUIRE_GPU();
  const Problem p = packed(4, 2, kHeadDim, {17, 0, 130, 200, 1}, {33, 5, 0, 200, 90});
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(p));
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(with_mask(p, true, -1, -1)));
}

TEST(GpuBackward, LayoutBHSD) {
  FUSEDATTN_REQUIRE_GPU();
  FUSEDATTN_RUN_OR_SKIP(backward_all_dtypes(dense(2, 4, 2, 170, 150, kHeadDim), Layout::kBHSD));
}

// ---- edges ---------------------------------------------------------------------------------------

// Without query rows the forward writes nothing and the backward only dk = dv = 0 (by 2-D memsets,
// api/zero_runs.h), dense, varlen and transposed.
TEST(GpuEdges, ZeroSizesWriteOnlyZeroKeyGradients) {
  FUSEDATTN_REQUIRE_GPU();
  for (const Layout layout : {Layout::kBSHD, Layout::kBHSD}) {
    for (const Problem& p : {dense(0, 2, 2, 10, 10, kHeadDim), dense(2, 2, 2, 0, 10, kHeadDim),
                             dense(2, 0, 0, 10, 10, kHeadDim), dense(2, 0, 2, 10, 10, kHeadDim),
                             packed(2, 2, kHeadDim, {0, 0}, {3, 0})}) {
      if (layout == Layout::kBHSD && p.varlen()) continue;
      for (DType dtype : kGpuDtypes) {
        SCOPED_TRACE(p.str() + " " + dtype_name(dtype) + (layout == Layout::kBHSD ? " BHSD" : ""));
        std::mt19937_64 rng = fresh_rng();
        HostCase c = make_case(p, dtype, layout, rng);
        DeviceCase dc(c);
        EXPECT_NO_THROW(forward(dc.forward_args()));
        EXPECT_EQ(c.out.to_double().size(), 0u);
        FUSEDATTN_RUN_OR_SKIP(dc.backward());
        expect_zero_key_gradients(c);
      }
    }
  }
}

TEST(GpuEdges, NoKeysMasksEveryRow) {
  FUSEDATTN_REQUIRE_GPU();
  for (const Problem& p : {dense(2, 2, 1, 10, 0, kHeadDim), packed(2, 2, kHeadDim, {3, 5}, {0, 0})}) {
    for (DType dtype : kGpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      DeviceCase dc(c);
      FUSEDATTN_RUN_OR_SKIP(dc.forward());
      for (double x : c.out.to_double()) ASSERT_EQ(x, 0.0);
      for (double x : c.lse.to_double()) ASSERT_EQ(x, -INFINITY);
      FUSEDATTN_RUN_OR_SKIP(dc.backward());
      for (double x : c.dq.to_double()) ASSERT_EQ(x, 0.0);
    }
  }
}

TEST(GpuEdges, FullyMaskedRowsGiveZeroAndMinusInf) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr int64_t kSq = 300, kSk = 100;  // causal: rows 0..199 see no key
  const Problem p = with_mask(dense(2, 2, 2, kSq, kSk, kHeadDim), true, -1, -1);
  for (DType dtype : kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
    FUSEDATTN_RUN_OR_SKIP(check_backward_gpu(c));
    const auto out = c.out.to_double(), lse = c.lse.to_double(), dq = c.dq.to_double();
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < kSq - kSk; ++i) {
          ASSERT_EQ(lse[lse_offset(p, b, h, i)], -INFINITY) << "row " << i;
          for (int d = 0; d < kHeadDim; ++d) {
            ASSERT_EQ(out[out_offset(p, b, h, i) + d], 0.0) << "row " << i;
            ASSERT_EQ(dq[out_offset(p, b, h, i) + d], 0.0) << "row " << i;
          }
        }
  }
}

TEST(GpuEdges, LargeLogitsStayFiniteAndCorrect) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr double kQueryGain = 100.0;
  for (const Problem& p : {dense(1, 2, 2, 200, 260, kHeadDim), with_mask(dense(1, 2, 1, 260, 200, kHeadDim), true, -1, -1)}) {
    for (DType dtype : kGpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      for (double& x : c.values.q) x = round_to(dtype, x * kQueryGain);
      refill_inputs(c);
      DeviceCase dc(c);
      FUSEDATTN_RUN_OR_SKIP(dc.forward());
      FUSEDATTN_RUN_OR_SKIP(dc.backward());
      expect_large_logits_results(p, c, kQueryGain);
    }
  }
}

// ---- NaN confinement -----------------------------------------------------------------------------

enum class Spread { kWholeRow, kOneColumn };
constexpr int kNanColumn = 7;

// `reaches(b, h, i)`: rows that must show the NaN. `may_reach(b, h, i)`: rows that may show it in
// the NaN's own column but need not (see check_key_side_nan); every other value must be finite.
template <typename Plant, typename Reaches, typename MayReach>
SkipReason check_nan_confinement(const Problem& p, DType dtype, Spread spread, Plant plant, Reaches reaches,
                                 MayReach may_reach) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
  plant(c.values);
  refill_inputs(c);
  DeviceCase dc(c);
  if (SkipReason skip = dc.forward()) return skip;
  const auto out = c.out.to_double(), lse = c.lse.to_double();
  int64_t wrong = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        const bool reached = reaches(b, h, i);
        const bool tolerated = !reached && may_reach(b, h, i);
        for (int d = 0; d < p.head_dim; ++d) {
          const double x = out[out_offset(p, b, h, i) + d];
          const bool nan_expected = reached && (spread == Spread::kWholeRow || d == kNanColumn);
          if (tolerated && d == kNanColumn) continue;
          if (nan_expected ? !std::isnan(x) : !std::isfinite(x)) {
            if (wrong++ == 0) ADD_FAILURE() << "out (" << b << ", " << h << ", " << i << ", " << d << ") = " << x;
          }
        }
        const double l = lse[lse_offset(p, b, h, i)];
        const bool lse_nan = reached && spread == Spread::kWholeRow;
        if (lse_nan ? !std::isnan(l) : !std::isfinite(l)) {
          if (wrong++ == 0) ADD_FAILURE() << "lse (" << b << ", " << h << ", " << i << ") = " << l;
        }
      }
  EXPECT_EQ(wrong, 0) << "values whose NaN-ness is wrong in " << case_name(c);
  return std::nullopt;
}

TEST(GpuNan, NanInOneQueryRowStaysInThatRow) {
  FUSEDATTN_REQUIRE_GPU();
  const Problem p = dense(2, 4, 2, 170, 190, kHeadDim);
  constexpr int kB = 1, kH = 3;
  constexpr int64_t kRow = 133;
  for (DType dtype : kGpuDtypes)
    FUSEDATTN_RUN_OR_SKIP(check_nan_confinement(
        p, dtype, Spread::kWholeRow, [&](Tensors& t) { t.q[out_offset(p, kB, kH, kRow) + kNanColumn] = kNaN; },
        [&](int b, int h, int64_t i) { return b == kB && h == kH && i == kRow; }, [](int, int, int64_t) { return false; }));
}

// A NaN in key row kKey of batch 1, KV head 0 reaches rows kKey.. (causal), or kKey..kKey+kLeft
// with a left window, of query heads 0 and 1 only. In v it reaches only its own column.
//
// A known limit of the GPU kernels (README "Limits"): P*V runs on the tensor cores over whole
// tiles, and a masked-off P entry is an exact 0, but 0 * NaN is NaN. So a NaN in v also reaches,
// in its own column, rows the mask hides the key from whenever their query tile processes the KV
// block holding the key (a block the mask edge cuts). A NaN in k is confined exactly (masked
// scores become -inf before the exponential). The CPU backend confines both exactly (tests/cpu).
// The largest query or KV block of the forward kernels at this test's lengths (the 192-row d64
// Hopper tile runs only from 2k queries on, sm90/fwd_launch.cuh).
constexpr int64_t kLargestTile = 128;

// Whether some row of row i's query tile may see some key of `key`'s KV block (dense problem,
// tiles aligned at multiples of kLargestTile; a superset of what smaller tiles process).
bool tile_processes_block_of(const Problem& p, int64_t i, int64_t key) {
  const int64_t t0 = i / kLargestTile * kLargestTile, t1 = std::min(t0 + kLargestTile, p.seqlen_q) - 1;
  const int64_t b0 = key / kLargestTile * kLargestTile, b1 = b0 + kLargestTile - 1;
  const int64_t shift = p.seqlen_k - p.seqlen_q;  // bottom-right alignment
  const int64_t right = p.causal ? 0 : p.window_right;
  const int64_t lo = p.window_left >= 0 ? t0 + shift - p.window_left : 0;  // first key of row t0
  const int64_t hi = right >= 0 ? t1 + shift + right : p.seqlen_k - 1;     // last key of row t1
  return lo <= b1 && hi >= b0;
}

void check_key_side_nan(std::vector<double> Tensors::*member, Spread spread) {
  constexpr int64_t kS = 300, kKey = 140, kLeft = 50;
  constexpr int kGroup = 2;
  for (const Problem& p : {with_mask(dense(2, 4, 2, kS, kS, kHeadDim), true, -1, -1),
                           with_mask(dense(2, 4, 2, kS, kS, kHeadDim), true, kLeft, -1)}) {
    for (DType dtype : kGpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      const int64_t last = p.window_left >= 0 ? kKey + kLeft : kS - 1;
      const int64_t key_offset = (kS + kKey) * p.heads_kv * p.head_dim;  // batch 1, KV head 0
      const SkipReason skip = check_nan_confinement(
          p, dtype, spread, [&](Tensors& t) { (t.*member)[key_offset + kNanColumn] = kNaN; },
          [&](int b, int h, int64_t i) { return b == 1 && h < kGroup && i >= kKey && i <= last; },
          [&](int b, int h, int64_t i) {
            return member == &Tensors::v && b == 1 && h < kGroup && tile_processes_block_of(p, i, kKey);
          });
      if (skip) GTEST_SKIP() << *skip;
    }
  }
}

TEST(GpuNan, NanInOneKeyRowReachesExactlyTheRowsThatSeeIt) {
  FUSEDATTN_REQUIRE_GPU();
  check_key_side_nan(&Tensors::k, Spread::kWholeRow);
}

TEST(GpuNan, NanInOneValueRowReachesTheRowsThatSeeItAndStaysInItsTiles) {
  FUSEDATTN_REQUIRE_GPU();
  check_key_side_nan(&Tensors::v, Spread::kOneColumn);
}

// ---- determinism and workspace ---------------------------------------------------------------------

// Long enough that several KV blocks and query blocks meet in the backward's accumulations.
Problem determinism_problem() { return with_mask(dense(1, 8, 2, 600, 700, kHeadDim), true, -1, -1); }
constexpr int kRuns = 3;

TEST(GpuDeterminism, ForwardIsBitIdenticalOverThreeRuns) {
  FUSEDATTN_REQUIRE_GPU();
  for (const Problem& p : {determinism_problem(), packed(4, 2, kHeadDim, {700, 0, 300}, {900, 20, 1})}) {
    for (DType dtype : kGpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      FUSEDATTN_RUN_OR_SKIP(expect_bit_identical_forwards(p, dtype, kRuns));
    }
  }
}

TEST(GpuDeterminism, DeterministicBackwardIsBitIdenticalOverThreeRuns) {
  FUSEDATTN_REQUIRE_GPU();
  for (const Problem& p : {determinism_problem(), packed(4, 1, kHeadDim, {700, 0, 300}, {900, 20, 1})}) {
    for (DType dtype : kGpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      DeviceCase dc(c);
      FUSEDATTN_RUN_OR_SKIP(dc.forward());
      std::vector<std::vector<unsigned char>> first;
      for (int run = 0; run < kRuns; ++run) {
        FUSEDATTN_RUN_OR_SKIP(dc.backward(/*deterministic=*/true));
        std::vector<std::vector<unsigned char>> now{bytes_of(c.dq), bytes_of(c.dk), bytes_of(c.dv)};
        if (run == 0)
          first = now;
        else
          for (size_t n = 0; n < now.size(); ++n) EXPECT_EQ(now[n], first[n]) << "gradient " << n << " differs on run " << run;
      }
      // Bit-identical and also right.
      Tensors ref = c.values, plain = c.values;
      reference_backward(p, ref);
      plain_backward(p, dtype, plain);
      EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), plain.dq, ref.dq, atol_for(dtype))) << "dq";
      EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol_for(dtype))) << "dk";
      EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol_for(dtype))) << "dv";
    }
  }
}

// The caller's workspace comes poisoned (0xFF bytes: NaN as floats, -1 as counters), as fresh
// cudaMalloc memory need not be: the library may read only what it wrote there first. The
// gradients match the library's own workspace's to the bit and the reference by the 2x rule.
TEST(GpuWorkspace, CallerWorkspaceGivesTheLibraryResult) {
  FUSEDATTN_REQUIRE_GPU();
  std::mt19937_64 rng = fresh_rng();
  const Problem p = with_mask(dense(2, 4, 2, 300, 250, kHeadDim), true, -1, -1);
  HostCase c = make_case(p, DType::kBFloat16, Layout::kBSHD, rng);
  DeviceCase dc(c);
  FUSEDATTN_RUN_OR_SKIP(dc.forward());
  FUSEDATTN_RUN_OR_SKIP(dc.backward(/*deterministic=*/true));
  const auto dq0 = bytes_of(c.dq), dk0 = bytes_of(c.dk), dv0 = bytes_of(c.dv);
  BackwardArgs a = dc.backward_args();
  a.deterministic = true;
  a.workspace_bytes = backward_workspace_bytes(a);
  void* workspace = nullptr;
  if (a.workspace_bytes > 0) {
    ASSERT_EQ(cudaMalloc(&workspace, a.workspace_bytes), cudaSuccess);
    // A memset runs on the legacy stream: finished before the call, whatever its stream.
    const bool poisoned = cudaMemset(workspace, kPoisonByte, a.workspace_bytes) == cudaSuccess &&
                          cudaDeviceSynchronize() == cudaSuccess;
    if (!poisoned) cudaFree(workspace);
    ASSERT_TRUE(poisoned) << "poisoning the workspace failed";
  }
  a.workspace = workspace;
  const SkipReason skip = dc.backward(a);
  if (workspace) cudaFree(workspace);
  FUSEDATTN_RUN_OR_SKIP(skip);
  EXPECT_EQ(bytes_of(c.dq), dq0);
  EXPECT_EQ(bytes_of(c.dk), dk0);
  EXPECT_EQ(bytes_of(c.dv), dv0);
  Tensors ref = c.values, plain = c.values;
  reference_backward(p, ref);
  plain_backward(p, c.dtype, plain);
  const double atol = atol_for(c.dtype);
  EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), plain.dq, ref.dq, atol)) << "dq";
  EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol)) << "dk";
  EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol)) << "dv";
}

}  // namespace
}  // namespace fusedattn::testing
