// The Hopper (sm90a) forward kernel, called directly (not through dispatch) so every test is
// known to exercise it: outputs against the float64 reference under the 2x rule (error at most
// twice that of a plain same-dtype implementation, plus a small atol), LSE against the
// reference, fully masked rows, NaN confinement, large logits, strides, GQA, partial head dims
// and each optimisation switched off. Outputs are poisoned before every run; inputs are fresh.
// Skips on devices other than compute capability 9.0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/dispatch.h"
#include "cuda/sm90/fwd_split.h"
#include "fusedattn/params.h"
#include "gpu/gpu_util.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"
#include "reference/problems.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

constexpr double kAtol = 1e-3;     // the 2x rule's absolute slack on outputs
constexpr double kLseAtol = 1e-3;  // LSE is computed in fp32 by every implementation
constexpr double kLog2e = 1.4426950408889634;

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// A device copy of a HostTensor, copied back on request.
struct DeviceBuffer {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  explicit DeviceBuffer(HostTensor& t) : bytes(t.nbytes()) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, t.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void copy_to(HostTensor& t) const { EXPECT_EQ(cudaMemcpy(t.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// The Hopper instance dispatch picks for p on an sm_90 device, or null when this build has none
// (e.g. a build without the head dim, or with FUSEDATTN_SM90=OFF).
cuda::FwdFn hopper_instance(const FwdParams& p) {
  try {
    const cuda::FwdChoice choice = cuda::choose_forward(p, 9, 0);
    return std::string(choice.arch) == "sm90" ? choice.fn : nullptr;
  } catch (const Error&) {
    return nullptr;
  }
}

OperandStrides strides_of(const TensorView& v) { return {v.stride[0], v.stride[1], v.stride[2]}; }

FwdParams params_for(const Problem& pr, DType dtype, const HostCase& c, const DeviceBuffer& q, const DeviceBuffer& k,
                     const DeviceBuffer& v, const DeviceBuffer& o, const DeviceBuffer& lse) {
  FwdParams p;
  HostCase& mc = const_cast<HostCase&>(c);
  p.q = q.ptr;
  p.k = k.ptr;
  p.v = v.ptr;
  p.o = o.ptr;
  p.lse = static_cast<float*>(lse.ptr);
  p.q_stride = strides_of(mc.q.view());
  p.k_stride = strides_of(mc.k.view());
  p.v_stride = strides_of(mc.v.view());
  p.o_stride = strides_of(mc.out.view());
  p.lse_batch_stride = int64_t{pr.heads_q} * pr.seqlen_q;
  p.lse_head_stride = pr.seqlen_q;
  set_shape(p, pr);
  p.dtype = dtype;
  p.scale = pr.scale();
  p.scale_log2 = static_cast<float>(pr.scale() * kLog2e);
  p.window_left = pr.window_left;
  p.window_right = pr.causal ? 0 : pr.window_right;
  return p;
}

struct RunResult {
  std::vector<double> out, lse;
};

// Poisons out/lse, runs the kernel, returns both in canonical order. Nothing where dispatch does
// not send the problem to the Hopper forward: with the reason in *skipped (if given) and a note
// where this build has no Hopper forward for its head dim and dtype, else after a recorded failure
// (sm90_forward_missing, sm90_plan.h).
std::optional<RunResult> run_kernel(HostCase& c, SkipReason* skipped = nullptr) {
  c.out.poison();
  c.lse.poison();
  DeviceBuffer q(c.q), k(c.k), v(c.v), o(c.out), lse(c.lse);
  const FwdParams p = params_for(c.problem, c.dtype, c, q, k, v, o, lse);
  const cuda::FwdFn fn = hopper_instance(p);
  if (fn == nullptr) {
    if (SkipReason why = sm90_forward_missing(c.problem, c.dtype)) {
      std::printf("%s: %s not run\n", why->c_str(), c.problem.str().c_str());
      if (skipped) *skipped = std::move(why);
    }
    return std::nullopt;
  }
  fn(p);
  check(cudaDeviceSynchronize(), "kernel");
  o.copy_to(c.out);
  lse.copy_to(c.lse);
  return RunResult{c.out.to_double(), c.lse.to_double()};
}

// Full comparison for problems small enough for the float64 reference. A case this build has no
// Hopper forward for is dropped and marks the test skipped (GTEST_SKIP here returns from this
// helper only: the test's other cases still run, and a failure among them still fails it); one
// that dispatch sends elsewhere fails (run_kernel).
void expect_matches_reference(HostCase& c, double atol = kAtol) {
  SkipReason skipped;
  const auto run = run_kernel(c, &skipped);
  if (!run) {
    if (skipped) GTEST_SKIP() << *skipped;
    return;
  }
  const RunResult& got = *run;
  Tensors ref = c.values, plain = c.values;
  reference_forward(c.problem, ref);
  plain_forward(c.problem, c.dtype, plain);
  EXPECT_TRUE(obeys_2x_rule(got.out, plain.out, ref.out, atol)) << c.problem.str();
  EXPECT_TRUE(all_close(got.lse, ref.lse, kLseAtol, kLseAtol)) << "lse " << c.problem.str();
}

Problem make_problem(int b, int hq, int hkv, int d, int64_t sq, int64_t sk, bool causal, int64_t wl = -1,
                     int64_t wr = -1) {
  return with_mask(dense(b, hq, hkv, sq, sk, d), causal, wl, wr);
}

struct ShapeCase {
  DType dtype;
  int head_dim;
};

class Sm90Shapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(Sm90Shapes, FullAndCausalMatchReference) {
  SKIP_UNLESS_HOPPER();
  const auto [dtype, d] = GetParam();
  auto rng = fresh_rng();
  // Lengths that are not block multiples, Sq != Sk both ways, GQA 4:2 and MQA.
  for (const Problem& pr : {make_problem(2, 4, 2, d, 300, 300, false), make_problem(2, 4, 2, d, 300, 300, true),
                            make_problem(1, 3, 1, d, 200, 515, true), make_problem(1, 2, 2, d, 515, 200, true),
                            make_problem(1, 2, 1, d, 77, 1, false), make_problem(2, 2, 1, d, 129, 65, false)}) {
    HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
    expect_matches_reference(c);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Sm90Shapes,
                         ::testing::Values(ShapeCase{DType::kFloat16, 64}, ShapeCase{DType::kFloat16, 96},
                                           ShapeCase{DType::kFloat16, 128}, ShapeCase{DType::kFloat16, 192},
                                           ShapeCase{DType::kFloat16, 256}, ShapeCase{DType::kBFloat16, 64},
                                           ShapeCase{DType::kBFloat16, 96}, ShapeCase{DType::kBFloat16, 128},
                                           ShapeCase{DType::kBFloat16, 192}, ShapeCase{DType::kBFloat16, 256}),
                         [](const auto& info) {
                           return std::string(info.param.dtype == DType::kFloat16 ? "fp16" : "bf16") + "_d" +
                                  std::to_string(info.param.head_dim);
                         });

TEST(Sm90Fwd, SlidingWindows) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (const Problem& pr : {make_problem(1, 2, 1, 128, 400, 400, false, 50, 10),
                            make_problem(1, 2, 2, 128, 300, 700, false, 130, 0),
                            make_problem(1, 2, 2, 64, 700, 300, false, 0, 0),
                            make_problem(2, 2, 1, 256, 260, 260, false, -1, 3),
                            make_problem(1, 2, 1, 192, 350, 420, false, 120, 30),
                            make_problem(1, 2, 1, 96, 350, 420, false, 120, 30),
                            make_problem(1, 2, 2, 128, 200, 200, false, 5, -1)}) {
    HostCase c = make_case(pr, DType::kFloat16, Layout::kBSHD, rng);
    expect_matches_reference(c);
  }
}

// Windows whose left edge leaves a tile's last rows without a key in its lowest block: where a
// tile's blocks go lowest first (TileMask::kAscending: d192's and d256's masked tiles, d64's pair
// tile) those rows have seen nothing when the next block runs, and where that block is uncut its
// sum check meets their -inf reference (the overflow must take the rescore and update() path).
// The edges fall just below, at and past block boundaries of the 64-, 80-, 112- and 128-key
// blocks, so over the 1024 rows' tiles the next block is sometimes the cut one, sometimes uncut.
// The head dims whose tiles go highest first check the same windows on that order.
TEST(Sm90Fwd, WindowRowsWithoutKeysBeforeAnUncutBlock) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  constexpr int64_t kQueries = 1024;
  for (const int d : {64, 96, 128, 192, 256})
    for (const int64_t left : {127, 255, 256, 300, 383})
      for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        const Problem pr = make_problem(1, 2, 1, d, kQueries, kQueries, false, left, 0);
        SCOPED_TRACE(pr.str());
        HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
        expect_matches_reference(c);
      }
}

// Sliding windows over long sequences take the short tiles' shapes by default (fwd_split.h,
// keys_per_row): d64's pair tile up to 1024 keys per row at any query length (a wider window
// keeps the 192-row tile), d192's and d256's 64-key blocks up to 4096. Each case asserts the
// shape its launch plans, then matches the reference (which walks only the window).
TEST(Sm90Fwd, ShortWindowsOverLongSequences) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  SkipReason skipped;  // a case this build cannot run on its own tile: dropped, the test skipped at its end
  struct Case {
    Problem pr;
    cuda::sm90::TileShape shape;
  };
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const Case& k : {Case{make_problem(1, 2, 1, 64, 2500, 2500, false, 300, 0), cuda::sm90::kD64Pair},
                          Case{make_problem(1, 2, 2, 64, 2100, 2300, false, 200, 100), cuda::sm90::kD64Pair},
                          Case{make_problem(1, 2, 1, 64, 2500, 2500, false, 1500, 0), cuda::sm90::kD64Tall},
                          Case{make_problem(1, 2, 1, 256, 4300, 4300, false, 500, 0), cuda::sm90::kD256Block64},
                          Case{make_problem(1, 2, 1, 192, 4300, 4300, false, 500, 0), cuda::sm90::kD192Block64}}) {
      SCOPED_TRACE(k.pr.str());
      const auto planned = expect_sm90_work(k.pr, dtype, skipped);
      if (!planned) continue;
      if (!has_own_sm90_instance(k.pr, dtype)) {  // the shapes are the instance's own
        if (!skipped) skipped = "this build has no Hopper instance of the head dim of " + k.pr.str() + " itself";
        continue;
      }
      EXPECT_EQ(planned->shape.block_m, k.shape.block_m);
      EXPECT_EQ(planned->shape.block_n, k.shape.block_n);
      EXPECT_EQ(planned->shape.ctas_per_sm, k.shape.ctas_per_sm);
      HostCase c = make_case(k.pr, dtype, Layout::kBSHD, rng);
      expect_matches_reference(c);
    }
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// The mask's two element-wise paths on every instance: windows with a left edge compare both
// bounds, those without one (causal, right-only, the full mask's sequence end) only the right
// bound; Sq > Sk gives causal rows that see no key (out 0, lse -inf in the reference).
TEST(Sm90Fwd, MaskPathsOnEveryInstance) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const int d : {64, 96, 128, 192, 256})
      for (const Problem& pr : {make_problem(1, 2, 1, d, 333, 333, false, 70, 20),
                                make_problem(1, 2, 1, d, 300, 300, false, 40, -1),
                                make_problem(1, 2, 1, d, 300, 300, false, -1, 9),
                                make_problem(1, 2, 1, d, 390, 140, true),
                                make_problem(1, 2, 1, d, 250, 250, false)}) {
        HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
        expect_matches_reference(c);
      }
}

// Head dims below the instance's: the TMA zero-fills the columns past head_dim (d40 runs on the
// 64 instance; d72 on the 96 one, whose half slab is then partly out of bounds; d136 and d184 on
// the 192 instance, or on the 256 one where 192 is not compiled, whose last 64-column slab is
// then entirely out of bounds).
TEST(Sm90Fwd, PartialHeadDims) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (int d : {8, 40, 72, 96, 136, 184, 200}) {
    HostCase c = make_case(make_problem(1, 2, 1, d, 190, 170, d % 16 == 8), DType::kBFloat16, Layout::kBSHD, rng);
    expect_matches_reference(c);
  }
}

TEST(Sm90Fwd, BhsdStrides) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  HostCase c = make_case(make_problem(2, 4, 2, 128, 333, 250, true), DType::kFloat16, Layout::kBHSD, rng);
  expect_matches_reference(c);
}

TEST(Sm90Fwd, LargeLogitsDoNotOverflow) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const Problem pr = make_problem(1, 2, 2, 64, 256, 256, true);
  HostCase c = make_case(pr, DType::kBFloat16, Layout::kBSHD, rng);
  constexpr double kLogitBoost = 100.0;
  for (double& x : c.values.q) x = round_to(c.dtype, x * kLogitBoost);
  refill_inputs(c);
  // Logits of ~1e3 make absolute errors scale with them; the 2x rule still applies.
  expect_matches_reference(c, 1e-2);
}

// Scores that rise along the kernel's block order, so a row's max moves in most KV blocks: by
// less than the rescale slack in some, by tens of log2 units in others, and in the spike case by
// ~190 log2 units at one key alone, where every probability against the stale max overflows.
// Both directions: towards the first keys (taken last where a tile's blocks go highest first) and
// towards the later ones (masked d192 and d256 tiles and d64's pair tile take the lowest first,
// TileMask::kAscending); the late spike sits at key kLateSpikeKey, which most rows see inside an
// uncut block. The unmasked step's check on the block's row sums must send all of these to the
// full update: from S kept aside on two-P-buffer tiles of full masks; over S (one P buffer: d64's
// 192-row tile, asserted through the plan, d192's 112-key and d256's 80-key blocks; the others
// under masks) by a rebase from the probabilities, or where they overflowed (the spike) from S
// computed again by the warp (Consumer::rescore). With slack 0 nearly every step fails the
// check, and with REBASE=0 every failed check computes S again; the same cases with the check
// off. Both dtypes, every head dim, full and causal; one test per setting and dtype, so that the
// GPU suite's shards share them out.
const std::vector<EnvSettings> kRisingScoreSettings = {
    {{"FUSEDATTN_SM90_SUM_CHECK", "1"}},
    {{"FUSEDATTN_SM90_SUM_CHECK", "1"}, {"FUSEDATTN_SM90_RESCALE_SLACK", "0"}},
    {{"FUSEDATTN_SM90_SUM_CHECK", "1"}, {"FUSEDATTN_SM90_RESCALE_SLACK", "0"}, {"FUSEDATTN_SM90_REBASE", "0"}},
    {{"FUSEDATTN_SM90_SUM_CHECK", "0"}},
};
class Sm90RisingScores : public ::testing::TestWithParam<std::tuple<EnvSettings, DType>> {};

TEST_P(Sm90RisingScores, RowMaximumRisingAcrossKeyBlocks) {
  SKIP_UNLESS_HOPPER();
  const auto& [settings, dtype] = GetParam();
  auto rng = fresh_rng();
  constexpr int64_t kHeads = 2;
  // d64 takes its 192-row tile from 2048 queries, under a causal mask only past 1024 keys.
  constexpr int64_t kTallTileQueries = 2100;
  constexpr double kQRamp = 16.0, kKRamp = 48.0, kSpike = 1500.0;
  constexpr int64_t kLateSpikeKey = 383;  // the last of 3 128-key blocks; inside d256's fifth block
  struct Shape {
    int d;
    int64_t sq, sk;
  };
  const ScopedEnvs scoped(settings);
  for (const Shape shape : {Shape{64, 200, 700}, Shape{64, kTallTileQueries, kTallTileQueries}, Shape{96, 200, 700},
                            Shape{128, 200, 700}, Shape{192, 200, 700}, Shape{256, 200, 700}})
    for (bool causal : {false, true})
      for (bool spike : {false, true})
        for (bool rising_late : {false, true}) {
          // The 192-row tile takes its blocks highest first; its long references cost the most.
          if (rising_late && shape.sq == kTallTileQueries) continue;
          const int d = shape.d;
          const int64_t sk = shape.sk;
          const Problem pr = make_problem(1, kHeads, kHeads, d, shape.sq, sk, causal);
          SCOPED_TRACE(pr.str() + (spike ? " spike " : " ramp ") + (rising_late ? "late " : "early ") +
                       scoped.label());
          if (shape.sq == kTallTileQueries) {
            const auto planned = planned_sm90_work(pr, dtype);
            if (planned) {
              EXPECT_EQ(planned->shape.block_m, cuda::sm90::kD64Tall.block_m);
            }
          }
          HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
          for (int64_t i = 0; i < shape.sq; ++i)
            for (int64_t h = 0; h < kHeads; ++h) c.values.q[(i * kHeads + h) * d] = round_to(dtype, kQRamp);
          const int64_t spike_key = rising_late ? kLateSpikeKey : 0;
          for (int64_t j = 0; j < sk; ++j) {
            const double ramp = static_cast<double>(rising_late ? j + 1 : sk - j) / sk;
            const double k0 = spike ? (j == spike_key ? kSpike : 0.0) : kKRamp * ramp * ramp;
            for (int64_t h = 0; h < kHeads; ++h) c.values.k[(j * kHeads + h) * d] = round_to(dtype, k0);
          }
          refill_inputs(c);
          // Logits up to ~2e4 / sqrt(d): absolute errors scale with them (as LargeLogitsDoNotOverflow).
          expect_matches_reference(c, 1e-2);
        }
}

// A test name for settings and a dtype ("SM90SUMCHECK1_fp16").
std::string settings_dtype_name(const ::testing::TestParamInfo<std::tuple<EnvSettings, DType>>& info) {
  return settings_test_name(std::get<0>(info.param)) + "_" + dtype_name(std::get<1>(info.param));
}
INSTANTIATE_TEST_SUITE_P(Settings, Sm90RisingScores,
                         ::testing::Combine(::testing::ValuesIn(kRisingScoreSettings),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         settings_dtype_name);

// Rows whose window is empty: out exactly 0 and lse -inf, never NaN.
TEST(Sm90Fwd, FullyMaskedRows) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const Problem pr = make_problem(1, 2, 1, 128, 300, 100, true);  // rows < 200 see no key
  HostCase c = make_case(pr, DType::kFloat16, Layout::kBSHD, rng);
  const auto run = run_kernel(c);
  if (!run) GTEST_SKIP() << "no sm90 instance";
  const RunResult& got = *run;
  for (int h = 0; h < pr.heads_q; ++h)
    for (int64_t i = 0; i < pr.seqlen_q - pr.seqlen_k; ++i) {
      EXPECT_EQ(got.lse[lse_offset(pr, 0, h, i)], -INFINITY) << "row " << i;
      for (int x = 0; x < pr.head_dim; ++x) ASSERT_EQ(got.out[out_offset(pr, 0, h, i) + x], 0.0) << "row " << i;
    }
  expect_matches_reference(c);
}

TEST(Sm90Fwd, NanStaysInItsRow) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const Problem pr = make_problem(1, 1, 1, 64, 200, 200, false);
  HostCase c = make_case(pr, DType::kFloat16, Layout::kBSHD, rng);
  constexpr int64_t kNanRow = 70;
  c.values.q[static_cast<size_t>(kNanRow * pr.head_dim + 3)] = NAN;
  refill_inputs(c);
  const auto run = run_kernel(c);
  if (!run) GTEST_SKIP() << "no sm90 instance";
  const RunResult& got = *run;
  for (int64_t i = 0; i < pr.seqlen_q; ++i) {
    const double x = got.out[out_offset(pr, 0, 0, i)];
    if (i == kNanRow)
      EXPECT_TRUE(std::isnan(x));
    else
      EXPECT_TRUE(std::isfinite(x)) << "row " << i;
  }
}

// Many tiles per CTA (phases wrap many times) on a problem too large for the full reference:
// sampled rows against the float64 row reference, 2x rule per row. The last row is always among
// them: it lies in each sequence's partial last tile.
constexpr int64_t kSampledSeqlen = 1500;
void expect_sampled_rows_match(const Problem& pr, std::mt19937_64& rng, const std::string& label) {
  HostCase c = make_case(pr, DType::kBFloat16, Layout::kBSHD, rng);
  const auto run = run_kernel(c);
  if (!run) GTEST_SKIP() << "no sm90 instance";
  const RunResult& got = *run;
  std::uniform_int_distribution<int64_t> row(0, pr.seqlen_q - 1);
  constexpr int kSamples = 48;
  for (int s = 0; s < kSamples; ++s) {
    const int b = s % pr.batch, h = (s * 7) % pr.heads_q;
    const int64_t i = s == 0 ? pr.seqlen_q - 1 : row(rng);
    const RowResult ref = reference_forward_row(pr, c.values, b, h, i);
    const RowResult plain = plain_forward_row(pr, c.dtype, c.values, b, h, i);
    const int64_t off = out_offset(pr, b, h, i);
    const std::vector<double> mine(got.out.begin() + off, got.out.begin() + off + pr.head_dim);
    EXPECT_TRUE(obeys_2x_rule(mine, plain.out, ref.out, kAtol))
        << pr.str() << " " << label << " b" << b << " h" << h << " row " << i;
    const double lse = got.lse[lse_offset(pr, b, h, i)];
    if (std::isinf(ref.lse))  // a row that sees no key
      EXPECT_EQ(lse, ref.lse) << label << " row " << i;
    else
      EXPECT_NEAR(lse, ref.lse, kLseAtol * (1 + std::fabs(ref.lse))) << label << " row " << i;
  }
}
void expect_sampled_rows_match(bool causal, std::mt19937_64& rng, const std::string& label, int head_dim = 128,
                               int64_t seqlen = kSampledSeqlen, int heads_kv = 4) {
  expect_sampled_rows_match(make_problem(4, 16, heads_kv, head_dim, seqlen, seqlen, causal), rng, label);
}

TEST(Sm90Fwd, SampledRowsOfALargeProblem) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (bool causal : {false, true}) expect_sampled_rows_match(causal, rng, "default schedule");
}

// The same under the static and the dynamic persistent schedule; the dynamic one for several
// launches in a row on fresh inputs, since each launch must leave its tile counter at zero for
// the next (a stale counter skips tiles, whose poisoned outputs then fail).
TEST(Sm90Fwd, PersistentSchedulesOfALargeProblem) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const ScopedEnv persistent("FUSEDATTN_SM90_PERSISTENT", "1");
  {
    const ScopedEnv static_schedule("FUSEDATTN_SM90_DYNAMIC", "0");
    for (bool causal : {false, true}) expect_sampled_rows_match(causal, rng, "static persistent");
  }
  const ScopedEnv dynamic_schedule("FUSEDATTN_SM90_DYNAMIC", "1");
  constexpr int kLaunches = 3;
  for (int launch = 0; launch < kLaunches; ++launch)
    for (bool causal : {false, true}) expect_sampled_rows_match(causal, rng, "dynamic, launch " + std::to_string(launch));
  // Many tiles per CTA walk the Q ring; once more with the single Q buffer.
  for (const char* prefetch : {"0", "1"}) {
    const ScopedEnv q_prefetch("FUSEDATTN_SM90_Q_PREFETCH", prefetch);
    for (bool causal : {false, true})
      expect_sampled_rows_match(causal, rng, std::string("dynamic, Q_PREFETCH=") + prefetch);
  }
}

// Many tiles per CTA on the two-Q-buffer tiles (d64's 128-row tile, d96, d128, d192's 64-key
// blocks), where the next tile's Q loads while this one runs, under the static and the dynamic
// schedule and with one Q buffer in use: tiles whose slices skip their first block (a window),
// each sequence's partial last tile with a slice without rows (1450 = 11 x 128 + 42) and causal
// Sq > Sk (tiles that see no key: out 0, lse -inf).
TEST(Sm90Fwd, TwoQBufferTilesBackToBack) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const ScopedEnv d64_tile("FUSEDATTN_SM90_D64_TILE", "128");
  const std::vector<EnvSettings> settings = {
      {{"FUSEDATTN_SM90_DYNAMIC", "0"}},
      {{"FUSEDATTN_SM90_DYNAMIC", "1"}},
      {{"FUSEDATTN_SM90_Q_PREFETCH", "0"}},
  };
  for (const auto& env : settings) {
    const ScopedEnvs scoped(env);
    const std::string& label = scoped.label();
    SCOPED_TRACE(label);
    for (int d : {64, 96, 128, 192}) {
      if (d == 64) expect_sampled_rows_match(true, rng, label, d, 1450);
      expect_sampled_rows_match(make_problem(2, 16, 4, d, 1450, 1700, false, 300, 40), rng, label + " window");
      expect_sampled_rows_match(make_problem(2, 16, 16, d, 1450, 700, true), rng, label + " causal Sq > Sk");
    }
  }
}

// d256 and d192's 112-key blocks (one Q buffer) give Q back after each warpgroup's last Q K^T and
// stage O in the tile's last KV stage (KernelConfig::kStagesOInKV), or with
// FUSEDATTN_SM90_O_IN_KV=0 in the Q buffer: many tiles per CTA (the announcement slots, the
// o_read barriers and the staging barriers wrap many times; 1450 rows leave each head's last tile
// a second slice without rows), the tail split of a full mask, tiles that see no key (causal
// Sq > Sk), windows whose slices skip blocks, and a tile with a single KV block.
// FUSEDATTN_SM90_DEFER_O_READ=1 gives the stage back behind the next tile's first Q K^T issue
// instead of in the epilogue (or before a slice skips a block). d256's 64-key tile stores each
// slice's staging as one box (stores_o_as_one_box: its dense, unpacked d256 cases, among them the
// 700-row ones), or with FUSEDATTN_SM90_O_ONE_BOX=0 one box per slab. One test per setting and
// head dim.
const std::vector<EnvSettings> kOStagingSettings = {
    {{"FUSEDATTN_SM90_O_IN_KV", "1"}, {"FUSEDATTN_SM90_DEFER_O_READ", "0"}},
    {{"FUSEDATTN_SM90_O_IN_KV", "1"}, {"FUSEDATTN_SM90_DEFER_O_READ", "1"}},
    {{"FUSEDATTN_SM90_O_IN_KV", "1"}, {"FUSEDATTN_SM90_O_ONE_BOX", "0"}},
    {{"FUSEDATTN_SM90_O_IN_KV", "0"}},
};
class Sm90OStaging : public ::testing::TestWithParam<std::tuple<EnvSettings, int>> {};

TEST_P(Sm90OStaging, OStagedInKVStages) {
  SKIP_UNLESS_HOPPER();
  const auto& [settings, d] = GetParam();
  auto rng = fresh_rng();
  constexpr int64_t kEmptySecondSlice = 1450;
  static_assert(kEmptySecondSlice % 128 > 0 && kEmptySecondSlice % 128 <= 64);
  const ScopedEnv d192_tile("FUSEDATTN_SM90_D192_TILE", "112");
  const ScopedEnvs scoped(settings);
  const std::string label = scoped.label() + " d" + std::to_string(d);
  SCOPED_TRACE(label);
  for (bool causal : {false, true}) expect_sampled_rows_match(causal, rng, label, d, kEmptySecondSlice);
  // Without GQA (whose packed rows give both slices the same blocks) a causal tile's first
  // slice skips the diagonal's second block, ahead of its own first one.
  expect_sampled_rows_match(true, rng, label + "no GQA", d, kEmptySecondSlice, 16);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const Problem& pr : {make_problem(1, 2, 1, d, 600, 300, true), make_problem(2, 2, 2, d, 333, 333, false, 70, 20),
                              make_problem(1, 2, 1, d, 170, 60, false), make_problem(2, 3, 1, d, 260, 260, true),
                              make_problem(1, 2, 2, d, 700, 700, false), make_problem(2, 2, 2, d, 700, 520, true)}) {
      HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
      expect_matches_reference(c);
    }
}

INSTANTIATE_TEST_SUITE_P(Settings, Sm90OStaging,
                         ::testing::Combine(::testing::ValuesIn(kOStagingSettings), ::testing::Values(256, 192)),
                         [](const ::testing::TestParamInfo<std::tuple<EnvSettings, int>>& info) {
                           return settings_test_name(std::get<0>(info.param)) + "_d" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The cases every forced tile shape runs, both dtypes: lengths that are not multiples of the
// tile (the partial tile is the first one), full and causal masks, Sq != Sk both ways, a window
// cutting blocks at both ends, a single key, and a head dim below the instance's (d).
void expect_tile_cases_match(int d, const std::string& label, std::mt19937_64& rng) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const Problem& pr : {make_problem(2, 4, 2, d, 300, 300, false), make_problem(2, 4, 2, d, 300, 300, true),
                              make_problem(1, 3, 1, d, 200, 515, true), make_problem(1, 2, 2, d, 515, 200, true),
                              make_problem(1, 2, 1, d, 385, 577, false, 100, 20),
                              make_problem(1, 2, 1, d, 193, 1, false), make_problem(1, 2, 2, d - 24, 200, 190, true)}) {
      HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
      SCOPED_TRACE(label);
      expect_matches_reference(c);
    }
}

// The d64 tile shapes (FUSEDATTN_SM90_D64_TILE): 128-row tiles, 192-row ones (three consumer
// warpgroups in a three-way GEMM turn, 160 registers each, cut blocks masked after P V) and the
// 128 x 64 tiles of two CTAs per SM (104 registers, no overlap, 64-key blocks that slices skip).
// Lengths that are not multiples of 192 or 128 (the partial tile is the first one), causal masks
// with Sq != Sk both ways, a window cutting blocks at both ends, both dtypes, a head dim below
// the instance's, the switches that change the schedule, and a problem with many tiles per CTA
// so the persistent schedule and the Q ring wrap many times.
TEST(Sm90Fwd, TileShapes) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  constexpr int d = 64;
  const std::vector<std::pair<const char*, const char*>> switches = {
      {"FUSEDATTN_SM90_PINGPONG", "0"}, {"FUSEDATTN_SM90_OVERLAP", "0"}, {"FUSEDATTN_SM90_Q_PREFETCH", "0"},
      {"FUSEDATTN_SM90_PERSISTENT", "0"}, {"FUSEDATTN_SM90_DYNAMIC", "0"}};
  for (const char* shape : {"128", "192", "pair"}) {
    const ScopedEnv tile("FUSEDATTN_SM90_D64_TILE", shape);
    const std::string label = std::string("FUSEDATTN_SM90_D64_TILE=") + shape;
    expect_tile_cases_match(d, label, rng);
    for (const auto& [k, v] : switches) {
      const ScopedEnv scoped(k, v);
      for (bool causal : {false, true}) {
        HostCase c = make_case(make_problem(1, 4, 2, d, 450, 420, causal), DType::kFloat16, Layout::kBSHD, rng);
        SCOPED_TRACE(label + " " + k + "=" + v);
        expect_matches_reference(c);
      }
    }
    for (bool causal : {false, true}) expect_sampled_rows_match(causal, rng, label, d);
  }
}

// The KV block widths of d256 (FUSEDATTN_SM90_D256_TILE: 80 keys for rows that see more than
// 4096 keys, 64 up to 4096) and of d192 (FUSEDATTN_SM90_D192_TILE: 112 and 64), each forced on
// every kind of mask: a causal diagonal split across blocks (80, 112) or whole (64, where the
// first slice skips its diagonal's second block), Sq != Sk both ways, a window cutting blocks at
// both ends, a single key, a head dim below the instance's, the overlap and O-in-KV switches,
// and a large problem's sampled rows.
void expect_block_widths_match(int d, const char* env, std::initializer_list<const char*> widths, std::mt19937_64& rng) {
  for (const char* width : widths) {
    const ScopedEnv tile(env, width);
    const std::string label = std::string(env) + "=" + width;
    expect_tile_cases_match(d, label, rng);
    for (const auto& [k, v] : {std::pair{"FUSEDATTN_SM90_OVERLAP", "0"}, std::pair{"FUSEDATTN_SM90_O_IN_KV", "0"}}) {
      const ScopedEnv scoped(k, v);
      HostCase c = make_case(make_problem(1, 4, 2, d, 450, 420, true), DType::kFloat16, Layout::kBSHD, rng);
      SCOPED_TRACE(label + " " + k + "=" + v);
      expect_matches_reference(c);
    }
    expect_sampled_rows_match(true, rng, label, d);
  }
}

TEST(Sm90Fwd, D256BlockWidths) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  expect_block_widths_match(256, "FUSEDATTN_SM90_D256_TILE", {"64", "80"}, rng);
}

TEST(Sm90Fwd, D192BlockWidths) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  expect_block_widths_match(192, "FUSEDATTN_SM90_D192_TILE", {"64", "112"}, rng);
}

// Partial last tiles whose last 64-row slices lie wholly past the sequence end: the consumer
// warpgroups owning those slices compute nothing there but must keep the GEMM turns, the K/V
// stages and the Q buffer's release in step with the others. 192-row d64 tiles with one empty
// slice (2048 = 10 x 192 + 128) and with two (64 + 192 k), 128-row tiles (d64 forced, d128,
// d256) with one (128 k + 40); full and causal, Sq != Sk both ways; the switches that change
// the number of turns (no overlap, also with one stage) or the schedule; and many tiles per CTA,
// so busy and idle tiles alternate while the rings wrap.
TEST(Sm90Fwd, EmptySlicesOfPartialTiles) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  constexpr int64_t kTallTileRows = 192, kTileRows = 128, kSliceRows = 64;
  constexpr int64_t kOneEmptySlice = 2048;                             // last 192-row tile: 128 rows
  constexpr int64_t kTwoEmptySlices = kSliceRows + 3 * kTallTileRows;  // last 192-row tile: 64 rows
  constexpr int64_t kRaggedRows = 40;
  constexpr int64_t kOneEmpty128 = 2 * kTileRows + kRaggedRows;  // last 128-row tile: 40 rows
  static_assert(kOneEmptySlice % kTallTileRows == 2 * kSliceRows && kTwoEmptySlices % kTallTileRows == kSliceRows);
  static_assert(kOneEmpty128 % kTileRows < kSliceRows);
  {
    const ScopedEnv tile("FUSEDATTN_SM90_D64_TILE", "192");
    SCOPED_TRACE("FUSEDATTN_SM90_D64_TILE=192");
    // One head at 2048 queries keeps the float64 reference affordable.
    for (bool causal : {false, true})
      for (const Problem& pr : {make_problem(1, 1, 1, 64, kOneEmptySlice, kOneEmptySlice, causal),
                                make_problem(1, 1, 1, 64, kOneEmptySlice, 1500, causal)}) {
        HostCase c = make_case(pr, DType::kFloat16, Layout::kBSHD, rng);
        expect_matches_reference(c);
      }
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (bool causal : {false, true})
        for (const Problem& pr : {make_problem(1, 2, 2, 64, kTwoEmptySlices, kTwoEmptySlices, causal),
                                  make_problem(2, 2, 1, 64, kTwoEmptySlices, 900, causal),
                                  make_problem(1, 2, 1, 64, kTwoEmptySlices, 300, causal)}) {
          HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
          expect_matches_reference(c);
        }
    const std::vector<EnvSettings> settings = {
        {{"FUSEDATTN_SM90_OVERLAP", "0"}},
        {{"FUSEDATTN_SM90_OVERLAP", "0"}, {"FUSEDATTN_SM90_STAGES", "1"}},
        {{"FUSEDATTN_SM90_PINGPONG", "0"}},
        {{"FUSEDATTN_SM90_EARLY_K", "0"}},
        {{"FUSEDATTN_SM90_Q_PREFETCH", "0"}},
        {{"FUSEDATTN_SM90_PERSISTENT", "0"}},
        {{"FUSEDATTN_SM90_DYNAMIC", "0"}}};
    for (const auto& env : settings) {
      const ScopedEnvs scoped(env);
      SCOPED_TRACE(scoped.label());
      for (bool causal : {false, true}) {
        HostCase c = make_case(make_problem(1, 2, 1, 64, kTwoEmptySlices, kTwoEmptySlices, causal), DType::kFloat16,
                               Layout::kBSHD, rng);
        expect_matches_reference(c);
      }
    }
    for (bool causal : {false, true})
      expect_sampled_rows_match(causal, rng, "two empty slices, 192-row tile", 64, kSliceRows + 7 * kTallTileRows);
  }
  // 2048 queries take the 192-row tile by default.
  for (bool causal : {false, true})
    expect_sampled_rows_match(causal, rng, "one empty slice, default tile", 64, kOneEmptySlice);
  {
    const ScopedEnv tile("FUSEDATTN_SM90_D64_TILE", "128");
    SCOPED_TRACE("128-row tile");
    for (const int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (const Problem& pr : {make_problem(1, 2, 1, d, kOneEmpty128, kOneEmpty128, causal),
                                  make_problem(1, 2, 1, d, kOneEmpty128, 500, causal)}) {
          HostCase c = make_case(pr, DType::kFloat16, Layout::kBSHD, rng);
          expect_matches_reference(c);
        }
    for (bool causal : {false, true})
      expect_sampled_rows_match(causal, rng, "one empty slice, 128-row tile", 128, 7 * kTileRows + kRaggedRows);
  }
}

// Every optimisation switched off in turn must still give the same answers.
// A slice's first block at half width (TileMask::kNarrowsFirstBlock) where its rows see only the
// block's first half. Bottom-right causal: slice 0's last row (63) sees keys up to 63 + Sk - Sq,
// so the offsets put its highest key just below, at and just above the half (64 of 128 keys; 56
// of d192's 112, 40 of d256's 80), and Sk < Sq; windows with a left edge take the two-bound mask
// on the narrow columns. The 192-row d64 tile has slices at both parities of the 128-key blocks.
// Tiles that take their blocks lowest first (d192, d256: TileMask::kAscending) have no narrow
// block: there the same cases check the cut diagonal taken last.
TEST(Sm90Fwd, NarrowFirstBlocks) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  constexpr int64_t kQueries = 256;
  for (const char* narrow : {"1", "0"}) {
    const ScopedEnv env("FUSEDATTN_SM90_NARROW_FIRST", narrow);
    SCOPED_TRACE(std::string("FUSEDATTN_SM90_NARROW_FIRST=") + narrow);
    for (const int d : {64, 96, 128, 192, 256})
      for (const int64_t offset : {-1, 0, 1, 16, 39, 40, 55, 56, 57, 63, 64, 65, 127})
        for (const bool window : {false, true}) {
          const Problem pr = window ? make_problem(1, 2, 1, d, kQueries, kQueries + offset, false, 50, 0)
                                    : make_problem(1, 2, 1, d, kQueries, kQueries + offset, true);
          HostCase c = make_case(pr, offset % 2 == 0 ? DType::kFloat16 : DType::kBFloat16, Layout::kBSHD, rng);
          expect_matches_reference(c);
        }
  }
  const ScopedEnv tile("FUSEDATTN_SM90_D64_TILE", "192");
  for (const int64_t offset : {0, 1, 64}) {
    HostCase c = make_case(make_problem(1, 2, 1, 64, 384, 384 + offset, true), DType::kFloat16, Layout::kBSHD, rng);
    expect_matches_reference(c);
  }
}

// d128's V ring is deeper than its K ring (tile_config.h, kD128VStages), so the two rings wrap
// at different blocks and their barrier phases part. The long-key cases wrap both rings many
// times inside a tile; the last case has more tiles (4 x 20 x 2) than an H200 has CTAs, so some
// CTAs carry the rings into a second tile. Settings: the default depths, V at K's depth with the rings still kept apart,
// and a one-deep K ring without the overlap beside the deep V ring; full, causal and windowed,
// ragged lengths, both dtypes.
TEST(Sm90Fwd, DeeperVRing) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const std::vector<EnvSettings> settings = {
      {},
      {{"FUSEDATTN_SM90_V_STAGES", "2"}},
      {{"FUSEDATTN_SM90_OVERLAP", "0"}, {"FUSEDATTN_SM90_STAGES", "1"}},
      {{"FUSEDATTN_SM90_EARLY_K", "0"}},
  };
  for (const auto& env : settings) {
    const ScopedEnvs scoped(env);
    SCOPED_TRACE(scoped.label());
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (const Problem& pr : {make_problem(1, 2, 1, 128, 300, 1700, false), make_problem(1, 2, 2, 128, 1100, 1037, true),
                                make_problem(1, 2, 1, 128, 900, 1300, false, 333, 40),
                                make_problem(4, 20, 20, 128, 129, 200, false)}) {
        SCOPED_TRACE(pr.str());
        HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
        expect_matches_reference(c);
      }
  }
}

TEST(Sm90Fwd, AblationSwitchesStayCorrect) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const std::vector<EnvSettings> settings = {
      {{"FUSEDATTN_SM90_OVERLAP", "0"}},
      {{"FUSEDATTN_SM90_OVERLAP", "1"}},
      {{"FUSEDATTN_SM90_PINGPONG", "0"}},
      {{"FUSEDATTN_SM90_PERSISTENT", "0"}},
      {{"FUSEDATTN_SM90_PERSISTENT", "1"}},
      {{"FUSEDATTN_SM90_DYNAMIC", "1"}},
      {{"FUSEDATTN_SM90_DYNAMIC", "1"}, {"FUSEDATTN_SM90_OVERLAP", "1"}},
      {{"FUSEDATTN_SM90_DYNAMIC", "0"}, {"FUSEDATTN_SM90_PERSISTENT", "0"}},
      {{"FUSEDATTN_SM90_DYNAMIC", "0"}},
      {{"FUSEDATTN_SM90_EARLY_K", "0"}},
      {{"FUSEDATTN_SM90_EARLY_K", "0"}, {"FUSEDATTN_SM90_OVERLAP", "1"}},
      {{"FUSEDATTN_SM90_OVERLAP", "0"}, {"FUSEDATTN_SM90_STAGES", "1"}, {"FUSEDATTN_SM90_PINGPONG", "0"}},
      {{"FUSEDATTN_SM90_RESCALE_SLACK", "0"}},
      {{"FUSEDATTN_SM90_RESCALE_SLACK", "12"}, {"FUSEDATTN_SM90_OVERLAP", "0"}},
      {{"FUSEDATTN_SM90_SUM_CHECK", "0"}},
      {{"FUSEDATTN_SM90_SUM_CHECK", "1"}, {"FUSEDATTN_SM90_RESCALE_SLACK", "3"}},
      {{"FUSEDATTN_SM90_Q_PREFETCH", "0"}},
      {{"FUSEDATTN_SM90_Q_PREFETCH", "1"}, {"FUSEDATTN_SM90_OVERLAP", "0"}},
      {{"FUSEDATTN_SM90_Q_PREFETCH", "1"}, {"FUSEDATTN_SM90_PERSISTENT", "0"}},
      {{"FUSEDATTN_SM90_NARROW_FIRST", "0"}},
      {{"FUSEDATTN_SM90_O_IN_KV", "0"}},
      {{"FUSEDATTN_SM90_DEFER_O_READ", "0"}},
      {{"FUSEDATTN_SM90_O_ONE_BOX", "0"}},
  };
  for (const auto& env : settings) {
    const ScopedEnvs scoped(env);
    for (bool causal : {false, true}) {
      for (int d : {64, 96, 128, 192, 256}) {
        HostCase c = make_case(make_problem(1, 4, 2, d, 300, 270, causal), DType::kFloat16, Layout::kBSHD, rng);
        expect_matches_reference(c);
      }
    }
  }
}

// GQA packing (sm90/fwd_split.h): a tile holds the query rows of a KV head's whole group of query
// heads, position-major. Short query sequences pack by default (a decode step's one query, a few
// speculative tokens, a sequence just past a tile multiple), longer ones with
// FUSEDATTN_SM90_PACK_GQA=1; groups 2 to 64, every tile shape (d64's 192-row tile from 512 tiled
// rows, 2048 with a mask), causal masks with Sq < Sk and Sq > Sk (bottom-right aligned: rows of
// one position share their keys), windows, ragged key lengths, both dtypes; LSE is checked per
// (head, position) like every other case. Each case asserts through planned_fwd_work whether it
// packs, so a silent fallback to unpacked tiles fails; a group that is no power of two stays
// unpacked under the switch.
// The pack shift the Hopper launch plans for pr; -1 where dispatch does not send pr to the Hopper
// forward: after a recorded failure, or where this build has no Hopper forward for its head dim,
// whose reason goes to `skipped` (expect_sm90_work, sm90_plan.h).
int planned_pack_shift(const Problem& pr, DType dtype, SkipReason& skipped) {
  const auto planned = expect_sm90_work(pr, dtype, skipped);
  return planned ? planned->rows.packing.shift : -1;
}

void expect_packed_case(const Problem& pr, DType dtype, bool packs, std::mt19937_64& rng, SkipReason& skipped) {
  SCOPED_TRACE(pr.str());
  const int shift = planned_pack_shift(pr, dtype, skipped);
  if (shift < 0) return;
  EXPECT_EQ(shift > 0, packs);
  HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
  expect_matches_reference(c);
}

TEST(Sm90Fwd, PackedGqaGroups) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  SkipReason skipped;  // a head dim this build lacks: its cases dropped, the test skipped at its end
  struct Case {
    Problem pr;
    bool packs;
  };
  // Packed by default: tiled rows fill the tiles far better than the unpacked query rows.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16})
    for (const Case& k : std::vector<Case>{{make_problem(2, 16, 2, 128, 1, 1000, true), true},
                                           {make_problem(1, 8, 1, 64, 3, 300, false), true},
                                           {make_problem(2, 32, 4, 256, 5, 777, true), true},
                                           {make_problem(1, 64, 1, 128, 2, 513, false), true},
                                           // Groups of 32 and 64 query heads at d256: two positions, or one,
                                           // in each 64-row warpgroup (the O map's grouped box).
                                           {make_problem(1, 32, 1, 256, 3, 300, false), true},
                                           {make_problem(1, 64, 1, 256, 2, 500, true), true},
                                           {make_problem(3, 4, 2, 64, 37, 200, false, 50, 0), true},
                                           {make_problem(1, 8, 2, 128, 130, 90, true), true},
                                           {make_problem(1, 4, 4, 128, 5, 300, false), false},
                                           {make_problem(1, 6, 2, 128, 5, 300, true), false}})
      expect_packed_case(k.pr, dtype, k.packs, rng, skipped);
  const ScopedEnv forced("FUSEDATTN_SM90_PACK_GQA", "1");
  for (const Case& k : std::vector<Case>{{make_problem(1, 8, 2, 128, 300, 300, true), true},
                                         {make_problem(1, 4, 1, 64, 700, 650, false), true},
                                         {make_problem(1, 8, 1, 64, 300, 400, true), true},
                                         {make_problem(2, 4, 2, 256, 200, 170, false, 30, 40), true},
                                         {make_problem(1, 128, 1, 64, 3, 100, false), false},
                                         {make_problem(1, 6, 2, 128, 100, 300, true), false}})
    expect_packed_case(k.pr, DType::kFloat16, k.packs, rng, skipped);
  const ScopedEnv off("FUSEDATTN_SM90_PACK_GQA", "0");
  expect_packed_case(make_problem(2, 16, 2, 128, 1, 1000, true), DType::kFloat16, false, rng, skipped);
  FUSEDATTN_RUN_OR_SKIP(skipped);
}

// Every problem problems(d) lists, at each head dim of `dims`, in both dtypes, against the
// reference, with the switch `name` on (1) and then off (0).
template <class Problems>
void expect_slices_match_with_switch(const char* name, std::initializer_list<int> dims, Problems problems) {
  auto rng = fresh_rng();
  for (const char* value : {"1", "0"}) {
    const ScopedEnv env(name, value);
    for (DType dtype : {DType::kFloat16, DType::kBFloat16})
      for (int d : dims)
        for (const Problem& pr : problems(d)) {
          SCOPED_TRACE(pr.str() + " " + name + "=" + value + " " + dtype_name(dtype));
          HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
          expect_matches_reference(c);
        }
  }
}

// Slices whose rows in use all lie in the first 8 of each warp's 16 run the one-row loop
// (Consumer::kOneRowCopy: the softmax on each thread's first row only; the second rows' P held at
// 0): decode steps of packed GQA groups of 4 (at 1000 and 9000 keys) and 8, one query without GQA
// (over enough keys that the tail split cuts its tiles into parts), a sequence's last tile with 5
// rows in its first slice and, beside them, 12 and 9 rows (the two-row loop). Key lengths that are
// not block multiples, head dims 64, 128 and 256 (the 64-key tile; the 80-key one, which the 2100-
// and 9000-key cases take, has no one-row copy), full masks (the API folds a decode step's causal
// mask into one: validate.cpp), both dtypes; each with the loop on and with
// FUSEDATTN_SM90_ONE_ROW=0, against the reference.
TEST(Sm90Fwd, OneRowSlicesMatchTheReference) {
  SKIP_UNLESS_HOPPER();
  // The one-row wgmma loop itself (the warp-split loop has its test below).
  const ScopedEnv wgmma("FUSEDATTN_SM90_WARP_SPLIT", "0");
  expect_slices_match_with_switch("FUSEDATTN_SM90_ONE_ROW", {64, 128, 256}, [](int d) {
    return std::vector<Problem>{make_problem(2, 32, 8, d, 1, 1000, false),   // 4 tiled rows
                                make_problem(1, 32, 8, d, 1, 9000, false),   // 4
                                make_problem(1, 16, 2, d, 1, 777, false),    // 8
                                make_problem(1, 8, 2, d, 3, 300, false),     // 12: two rows
                                make_problem(2, 4, 4, d, 1, 2100, false),    // one query, unpacked
                                make_problem(1, 2, 2, d, 133, 400, false),   // the last tile: 5 rows
                                make_problem(1, 2, 2, d, 137, 400, false)};  // 9
  });
}

// The same slices with each block's keys split over the warpgroup's warps (Consumer::
// kWarpSplitCopy, warp_split.cuh: warp-level MMAs on the slice's first 16 rows, a softmax per warp,
// the warps' rows merged at the tile's end), on by default, against the reference and beside the
// one-row wgmma loop (FUSEDATTN_SM90_WARP_SPLIT=0): key counts under one block (20: the last warps
// see no key) and over one (130: every warp's keys of the second block but the first warp's
// masked), block multiples and not, many blocks (9000), tiles cut into parts (2100 keys, one
// query), the second warpgroup's slice of 8 rows beside a full first one (200 queries), a 5-row
// last tile, 12 rows (the two-row loop), head dims 64, 96, 128 and 192 (d256 has no such copy:
// it runs the one-row loop), both dtypes.
TEST(Sm90Fwd, WarpSplitSlicesMatchTheReference) {
  SKIP_UNLESS_HOPPER();
  expect_slices_match_with_switch("FUSEDATTN_SM90_WARP_SPLIT", {64, 96, 128, 192}, [](int d) {
    return std::vector<Problem>{make_problem(2, 32, 8, d, 1, 20, false),    // 4 tiled rows
                                make_problem(1, 32, 8, d, 1, 130, false),   // 4
                                make_problem(3, 16, 2, d, 1, 1024, false),  // 8
                                make_problem(1, 32, 4, d, 1, 9000, false),  // 8
                                make_problem(2, 4, 4, d, 1, 2100, false),   // one query, unpacked
                                make_problem(1, 2, 2, d, 200, 333, false),  // 64 + 8 rows
                                make_problem(1, 2, 2, d, 133, 400, false),  // the last tile: 5 rows
                                make_problem(1, 8, 2, d, 3, 300, false)};   // 12: two rows
  });
}

// Many packed tiles per CTA, sampled rows (a short query sequence of many heads) under the
// persistent schedules; the full mask's few tiles also take the tail split's parts.
TEST(Sm90Fwd, PackedGqaOverManyTiles) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (bool causal : {false, true})
    for (const char* dynamic : {"0", "1"}) {
      const ScopedEnv schedule("FUSEDATTN_SM90_DYNAMIC", dynamic);
      const Problem pr = make_problem(8, 32, 4, 128, 40, 2000, causal);
      SkipReason skipped;
      const int shift = planned_pack_shift(pr, DType::kBFloat16, skipped);
      FUSEDATTN_RUN_OR_SKIP(skipped);
      if (shift < 0) continue;  // a failure is recorded
      ASSERT_GT(shift, 0);
      HostCase c = make_case(pr, DType::kBFloat16, Layout::kBSHD, rng);
      SCOPED_TRACE(std::string("FUSEDATTN_SM90_DYNAMIC=") + dynamic);
      expect_matches_reference(c);
    }
}

// Captures the Hopper forward of c on a fresh stream into a CUDA graph, lets `inspect` see the
// graph, and replays it twice, out and lse poisoned before each replay and checked against the
// reference after it. False where dispatch does not send c to the Hopper forward: after a note
// where the build has no Hopper forward for its head dim, else after a recorded failure
// (sm90_forward_missing).
template <class Inspect>
bool expect_captured_forward_matches(HostCase& c, Inspect inspect) {
  DeviceBuffer q(c.q), k(c.k), v(c.v), o(c.out), lse(c.lse);
  FwdParams p = params_for(c.problem, c.dtype, c, q, k, v, o, lse);
  const cuda::FwdFn fn = hopper_instance(p);
  if (fn == nullptr) {
    if (const SkipReason why = sm90_forward_missing(c.problem, c.dtype))
      std::printf("%s: %s not run\n", why->c_str(), c.problem.str().c_str());
    return false;
  }
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  p.stream = stream;
  const CapturedGraph graph(stream, [&] { fn(p); });
  inspect(graph.graph());
  Tensors ref = c.values, plain = c.values;
  reference_forward(c.problem, ref);
  plain_forward(c.problem, c.dtype, plain);
  constexpr int kReplays = 2;
  for (int replay = 0; replay < kReplays; ++replay) {
    c.out.poison();
    c.lse.poison();
    check(cudaMemcpy(o.ptr, c.out.data(), o.bytes, cudaMemcpyHostToDevice), "poison out");
    check(cudaMemcpy(lse.ptr, c.lse.data(), lse.bytes, cudaMemcpyHostToDevice), "poison lse");
    // A copy from pageable memory may return before its DMA has landed, on the legacy stream,
    // which `stream` does not wait for.
    check(cudaDeviceSynchronize(), "poison");
    graph.replay();
    o.copy_to(c.out);
    lse.copy_to(c.lse);
    EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, kAtol)) << c.problem.str() << " replay " << replay;
    EXPECT_TRUE(all_close(c.lse.to_double(), ref.lse, kLseAtol, kLseAtol)) << "lse, replay " << replay;
  }
  cudaStreamDestroy(stream);
  return true;
}

// Captured into a CUDA graph on a stream the library has never seen (torch's CUDA graphs and
// torch.compile's "reduce-overhead" do this): the dynamic schedule's counter cannot be allocated
// during a capture, so the launch must fall back to a static schedule instead of failing, and
// every replay of the graph must give the right answer.
TEST(Sm90Fwd, GraphCaptureOnAFreshStream) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (bool causal : {false, true}) {
    HostCase c = make_case(make_problem(2, 4, 2, 128, 700, 650, causal), DType::kFloat16, Layout::kBSHD, rng);
    if (!expect_captured_forward_matches(c, [](cudaGraph_t) {})) GTEST_SKIP() << "no sm90 d128 instance in this build";
  }
}

// The nodes of `graph` of type `type`.
int graph_nodes_of(cudaGraph_t graph, cudaGraphNodeType type) {
  size_t count = 0;
  check(cudaGraphGetNodes(graph, nullptr, &count), "graph nodes");
  std::vector<cudaGraphNode_t> nodes(count);
  check(cudaGraphGetNodes(graph, nodes.data(), &count), "graph nodes");
  int matching = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    check(cudaGraphNodeGetType(node, &t), "node type");
    matching += t == type;
  }
  return matching;
}

// A decode step captured on a stream that never ran a split forward outside a capture (so it has
// no split workspace of its own) still cuts its few tiles into parts: the workspace is allocated
// and zeroed beside the capture (stream_buffer.h), so the graph holds the kernel alone, no
// allocation or memset node. Before, such a capture ran every tile whole, 3-7x slower at batch 1
// (docs/hopper.md, session 92). The parts are combined in a fixed order, so the replays match an
// eager call, which splits, to the bit; the tiles run whole would sum in another order.
TEST(Sm90Fwd, DecodeCapturedOnAFreshStreamKeepsItsParts) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    HostCase c = make_case(make_problem(1, 32, 8, 128, 1, 32768, false), dtype, Layout::kBSHD, rng);
    const auto eager = run_kernel(c);
    if (!eager) GTEST_SKIP() << "no sm90 d128 instance in this build";
    const std::vector<unsigned char> eager_out = bytes_of(c.out), eager_lse = bytes_of(c.lse);
    expect_captured_forward_matches(c, [](cudaGraph_t graph) {
      EXPECT_EQ(graph_nodes_of(graph, cudaGraphNodeTypeKernel), 1) << "the forward's kernel alone";
      EXPECT_EQ(graph_nodes_of(graph, cudaGraphNodeTypeMemAlloc), 0);
      EXPECT_EQ(graph_nodes_of(graph, cudaGraphNodeTypeMemset), 0);
    });
    EXPECT_EQ(bytes_of(c.out), eager_out) << "the captured step's out differs from the eager call's";
    EXPECT_EQ(bytes_of(c.lse), eager_lse) << "the captured step's lse differs from the eager call's";
  }
}

// The edges of `graph`.
size_t graph_edges(cudaGraph_t graph) {
  size_t count = 0;
  check(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count), "graph edges");
  return count;
}

// The quad mix (d256 full masks: clusters of four or eight beside pairs, fwd_launch.cuh launch_quad_mix)
// captured on a fresh stream: its two launches become two kernel nodes side by side on the
// capturing stream (CapturedFork), no second stream, no event node, no edge between them. Before
// session 95 a capture ran the pairs alone. The replays match the reference and, to the bit, an
// eager call of the mix (the same items on the same kernels).
TEST(Sm90Fwd, QuadMixCapturedOnAFreshStream) {
  SKIP_UNLESS_HOPPER();
  auto rng = fresh_rng();
  const ScopedEnvs mix(
      {{"FUSEDATTN_SM90_CLUSTER", "1"}, {"FUSEDATTN_SM90_QUAD_MIX", ""}, {"FUSEDATTN_SM90_MIX_CLUSTER", ""}});
  // 62 heads of 4 query blocks, 124 pair items: on the H200 (30 quads, 6 pairs) two rounds of
  // quads (60 quad items) and 4 pair items (QuadMixShares). Of 8 query blocks, clusters of eight:
  // on the H200 (15 octets, 6 pairs) four rounds of octets (60 octet items) and 8 pair items.
  const struct {
    int64_t queries;
    int mix_ctas;
  } mixes[] = {{512, cuda::sm90::kQuadCluster}, {1024, cuda::sm90::kOctetCluster}};
  for (const auto& mix_case : mixes) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      const Problem pr = make_problem(1, 62, 62, 256, mix_case.queries, 300, false);
      SCOPED_TRACE(pr.str() + " " + dtype_name(dtype));
      SkipReason skipped;
      const auto work = expect_sm90_work(pr, dtype, skipped);
      FUSEDATTN_RUN_OR_SKIP(skipped);
      if (!work) continue;  // a failure is recorded
      ASSERT_EQ(work->quad_mix_ctas, mix_case.mix_ctas) << "the plan must mix clusters and pairs here";
      HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
      ASSERT_TRUE(run_kernel(c).has_value());
      const std::vector<unsigned char> eager_out = bytes_of(c.out), eager_lse = bytes_of(c.lse);
      expect_captured_forward_matches(c, [&](cudaGraph_t graph) {
        EXPECT_EQ(graph_nodes_of(graph, cudaGraphNodeTypeKernel), 2)
            << "the quads' and the pairs' kernels (one: QuadMixShares gave one launch every item)";
        EXPECT_EQ(graph_nodes_of(graph, cudaGraphNodeTypeEventRecord), 0);
        EXPECT_EQ(graph_nodes_of(graph, cudaGraphNodeTypeWaitEvent), 0);
        EXPECT_EQ(graph_edges(graph), 0u) << "the two launches side by side";
      });
      EXPECT_EQ(bytes_of(c.out), eager_out) << "the captured mix's out differs from the eager call's";
      EXPECT_EQ(bytes_of(c.lse), eager_lse) << "the captured mix's lse differs from the eager call's";
    }
  }
}

}  // namespace
}  // namespace fusedattn::testing
