// The CPU backend at the edges: zero sizes, fully masked rows, large logits, NaN confinement, and
// bit-identical results run to run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>

#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kHeadDim = 64;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- zero sizes --------------------------------------------------------------------------------

// A valid call without query rows computes nothing: the forward has nothing to write, and the
// backward writes only the key gradients (expect_zero_key_gradients, test_util.h).

// run_backward's views follow the case's layout ([B, H, S, D] for kBHSD).
void expect_no_query_rows(const Problem& p, Layout layout = Layout::kBSHD) {
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, dtype, layout, rng);
    EXPECT_NO_THROW(run_forward(c));
    EXPECT_EQ(c.out.to_double().size(), 0u);
    EXPECT_NO_THROW(run_backward(c));
    expect_zero_key_gradients(c);
  }
}

TEST(CpuZeroSizes, ZeroBatchIsANoop) { expect_no_query_rows(dense(0, 2, 2, 10, 10, kHeadDim)); }
TEST(CpuZeroSizes, ZeroQueryLengthGivesZeroKeyGradients) { expect_no_query_rows(dense(2, 2, 2, 0, 10, kHeadDim)); }
TEST(CpuZeroSizes, ZeroHeadsIsANoop) { expect_no_query_rows(dense(2, 0, 0, 10, 10, kHeadDim)); }
TEST(CpuZeroSizes, ZeroQueryHeadsGiveZeroKeyGradients) { expect_no_query_rows(dense(2, 0, 2, 10, 10, kHeadDim)); }
TEST(CpuZeroSizes, VarlenWithNoQueryRowsGivesZeroKeyGradients) {
  expect_no_query_rows(packed(2, 2, kHeadDim, {0, 0}, {3, 0}));
}
// torch hands the gradient of an empty output over as an expanded view (stride 0 everywhere): a
// tensor without elements has no layout to turn down.
TEST(CpuZeroSizes, TensorsWithoutElementsTakeAnyStrides) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(dense(2, 2, 2, 0, 10, kHeadDim), DType::kFloat32, Layout::kBSHD, rng);
  BackwardArgs a = backward_args(c);
  for (TensorView* t : {&a.dout, &a.q, &a.out, &a.dq})
    for (int d = 0; d < t->rank; ++d) t->stride[d] = 0;
  c.dk.poison();
  c.dv.poison();
  EXPECT_NO_THROW(backward(a));
  expect_zero_key_gradients(c);
}

// Key gradients laid out [B, H, S, D].
TEST(CpuZeroSizes, ZeroQueryLengthZeroesStridedKeyGradients) {
  expect_no_query_rows(dense(2, 4, 2, 0, 9, 40), Layout::kBHSD);
}

// No keys at all: every query row is fully masked.
void expect_all_rows_masked(const Problem& p) {
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
    run_forward(c);
    for (double x : c.out.to_double()) ASSERT_EQ(x, 0.0);
    for (double x : c.lse.to_double()) ASSERT_EQ(x, -INFINITY);
    run_backward(c);
    for (double x : c.dq.to_double()) ASSERT_EQ(x, 0.0);
  }
}

TEST(CpuZeroSizes, ZeroKeyLengthMasksEveryRow) { expect_all_rows_masked(dense(2, 2, 1, 10, 0, kHeadDim)); }
TEST(CpuZeroSizes, VarlenWithNoKeysMasksEveryRow) { expect_all_rows_masked(packed(2, 2, kHeadDim, {3, 5}, {0, 0})); }

// ---- variable-length bounds ---------------------------------------------------------------------

// max_seqlen_q/k only bound the sequences (flash_attn takes a model's context length there). Far
// above them, as far as int64 goes, the call must still run at once and give the exact result:
// the task list was sized by max_seqlen_q, so 2^40 ran for hours and 2^62 never returned.
TEST(CpuVarlen, MaxSeqlenFarAboveTheSequences) {
  Problem p = with_mask(packed(3, 1, kHeadDim, {5, 0, 9}, {7, 3, 9}), true, -1, -1);
  for (const int64_t bound : {int64_t{1} << 40, std::numeric_limits<int64_t>::max()}) {
    p.max_seqlen_bound = bound;
    for (DType dtype : kCpuDtypes) check_backward(p, dtype);
  }
}

// seqused_k: each sequence attends to the first keys of its rows, its masks aligned to that
// count (a decode step over padded KV caches); entries below 0 or past the rows are clamped.
TEST(CpuVarlen, SequsedKLimitsEachSequencesKeys) {
  Problem p = packed(4, 2, kHeadDim, {1, 5, 3, 2, 4, 6}, {9, 12, 7, 0, 6, 8});
  p.seqused_k = {4, 12, -3, 5, 100, 0};
  const std::tuple<bool, int64_t, int64_t> masks[] = {{false, -1, -1}, {true, -1, -1}, {false, 2, 1}};
  for (const auto& [causal, left, right] : masks)
    for (DType dtype : kCpuDtypes) check_forward(with_mask(p, causal, left, right), dtype);
}

// ---- fully masked rows -------------------------------------------------------------------------

TEST(CpuMaskedRows, CausalWithSqAboveSkGivesZeroAndMinusInf) {
  // Bottom-right alignment: with Sq = 100, Sk = 30 rows 0..69 see no key.
  constexpr int64_t kSq = 100, kSk = 30;
  const Problem p = with_mask(dense(2, 2, 2, kSq, kSk, kHeadDim), true, -1, -1);
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    HostCase c = check_backward(p, dtype);
    const auto out = c.out.to_double(), lse = c.lse.to_double(), dq = c.dq.to_double();
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < kSq; ++i) {
          const bool masked = i < kSq - kSk;
          const double l = lse[lse_offset(p, b, h, i)];
          if (masked) {
            ASSERT_EQ(l, -INFINITY) << "row " << i;
          } else {
            ASSERT_TRUE(std::isfinite(l)) << "row " << i;
          }
          for (int d = 0; d < kHeadDim; ++d) {
            const int64_t o = out_offset(p, b, h, i) + d;
            if (masked) {
              ASSERT_EQ(out[o], 0.0) << "row " << i;
              ASSERT_EQ(dq[o], 0.0) << "row " << i;
            }
            ASSERT_TRUE(std::isfinite(out[o]) && std::isfinite(dq[o])) << "row " << i;
          }
        }
  }
}

// ---- large logits --------------------------------------------------------------------------------

TEST(CpuLargeLogits, QueryTimesHundredStaysFiniteAndCorrect) {
  constexpr double kQueryGain = 100.0;
  for (const Problem& p : {dense(1, 2, 2, 100, 120, kHeadDim), with_mask(dense(1, 2, 1, 120, 100, kHeadDim), true, -1, -1)}) {
    for (DType dtype : kCpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      for (double& x : c.values.q) x = round_to(dtype, x * kQueryGain);
      refill_inputs(c);
      run_forward(c);
      run_backward(c);
      expect_large_logits_results(p, c, kQueryGain);
    }
  }
}

// ---- NaN confinement -------------------------------------------------------------------------------

// How far a planted NaN spreads within a row that sees it: a NaN score (from q or k) poisons the
// whole softmax of the row, lse included; a NaN in v only reaches the output column it sits in.
enum class Spread { kWholeRow, kOneColumn };
constexpr int kNanColumn = 7;

// Checks row (b, h, i) of out and lse: all finite when `reached` is false, else NaN where
// `spread` says and finite elsewhere.
void expect_row(const std::vector<double>& out, const std::vector<double>& lse, const Problem& p, int b, int h,
                int64_t i, bool reached, Spread spread) {
  const int64_t o = out_offset(p, b, h, i);
  for (int d = 0; d < p.head_dim; ++d) {
    const bool nan_expected = reached && (spread == Spread::kWholeRow || d == kNanColumn);
    if (nan_expected)
      ASSERT_TRUE(std::isnan(out[o + d])) << "out (" << b << ", " << h << ", " << i << ", " << d << ") should be NaN";
    else
      ASSERT_TRUE(std::isfinite(out[o + d])) << "out (" << b << ", " << h << ", " << i << ", " << d
                                             << ") should be finite, got " << out[o + d];
  }
  const double l = lse[lse_offset(p, b, h, i)];
  if (reached && spread == Spread::kWholeRow)
    ASSERT_TRUE(std::isnan(l)) << "lse (" << b << ", " << h << ", " << i << ") should be NaN";
  else
    ASSERT_TRUE(std::isfinite(l)) << "lse (" << b << ", " << h << ", " << i << ") should be finite, got " << l;
}

// Runs the forward with a NaN planted by `plant` and checks that exactly the rows `reaches`
// names are NaN (as `spread` says) and that every other row still matches the reference. The
// outputs start at a finite value, not the NaN poison, so that a NaN expected was written.
template <typename Plant, typename Reaches>
void check_nan_confinement(const Problem& p, DType dtype, Spread spread, Plant plant, Reaches reaches) {
  constexpr double kUnwritten = 7.0;
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
  plant(c.values);
  refill_inputs(c);
  c.out.fill(std::vector<double>(c.out.to_double().size(), kUnwritten));
  c.lse.fill(std::vector<double>(c.lse.to_double().size(), kUnwritten));
  forward(forward_args(c));
  const auto out = c.out.to_double(), lse = c.lse.to_double();
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seqlen_q; ++i) expect_row(out, lse, p, b, h, i, reaches(b, h, i), spread);
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  if (dtype != DType::kFloat32) plain_forward(p, dtype, plain);
  expect_matches("out", dtype, out, ref.out, plain.out, kFp32OutAtol, kFp32OutRtol, atol_for(dtype), case_name(c));
}

TEST(CpuNan, NanInOneQueryRowStaysInThatRow) {
  const Problem p = dense(2, 4, 2, 70, 90, kHeadDim);
  constexpr int kB = 1, kH = 3;
  constexpr int64_t kRow = 33;
  for (DType dtype : kCpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    check_nan_confinement(
        p, dtype, Spread::kWholeRow, [&](Tensors& t) { t.q[out_offset(p, kB, kH, kRow) + kNanColumn] = kNaN; },
        [&](int b, int h, int64_t i) { return b == kB && h == kH && i == kRow; });
  }
}

// Key row kKey of KV head 0 holds a NaN (in k or in v): with a causal window of width kLeft only
// rows kKey..kKey+kLeft of the query heads that read KV head 0 see it.
template <typename Member>
void check_key_side_nan(Member member, Spread spread) {
  constexpr int64_t kS = 100, kKey = 40, kLeft = 20;
  constexpr int kGroup = 2;  // query heads 0 and 1 read KV head 0
  for (const Problem& p : {with_mask(dense(2, 4, 2, kS, kS, kHeadDim), true, -1, -1),
                           with_mask(dense(2, 4, 2, kS, kS, kHeadDim), true, kLeft, -1)}) {
    for (DType dtype : kCpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      const int64_t last = p.window_left >= 0 ? kKey + kLeft : kS - 1;
      const int64_t key_offset = (int64_t{kS} * 1 + kKey) * p.heads_kv * p.head_dim;  // batch 1, KV head 0
      check_nan_confinement(
          p, dtype, spread, [&](Tensors& t) { (t.*member)[key_offset + kNanColumn] = kNaN; },
          [&](int b, int h, int64_t i) { return b == 1 && h < kGroup && i >= kKey && i <= last; });
    }
  }
}

TEST(CpuNan, NanInOneKeyRowReachesExactlyTheRowsThatSeeIt) { check_key_side_nan(&Tensors::k, Spread::kWholeRow); }
TEST(CpuNan, NanInOneValueRowReachesExactlyTheRowsThatSeeIt) { check_key_side_nan(&Tensors::v, Spread::kOneColumn); }

// Decode steps (one query row: src/cpu/decode.cpp reads every head of a key at once): a NaN in key
// kKey of KV head 1 reaches exactly the query heads of its group, and none where a window hides
// the key.
template <typename Member>
void check_decode_key_side_nan(Member member, Spread spread) {
  constexpr int64_t kKeys = 300, kKey = 150;
  constexpr int kKvHead = 1, kGroup = 4;  // query heads 4..7 read KV head 1
  const Problem full = dense(2, 8, 2, 1, kKeys, kHeadDim);
  for (const Problem& p : {full, with_mask(full, false, 100, 0)}) {
    for (DType dtype : kCpuDtypes) {
      SCOPED_TRACE(p.str() + " " + dtype_name(dtype));
      const bool seen = p.window_left < 0;  // the window's one row sees keys 199..299 only
      const int64_t key_offset = ((kKeys * 1 + kKey) * p.heads_kv + kKvHead) * p.head_dim;  // batch 1
      check_nan_confinement(
          p, dtype, spread, [&](Tensors& t) { (t.*member)[key_offset + kNanColumn] = kNaN; },
          [&](int b, int h, int64_t) { return seen && b == 1 && h / kGroup == kKvHead; });
    }
  }
}

TEST(CpuNan, DecodeNanInOneKeyReachesExactlyItsGroup) { check_decode_key_side_nan(&Tensors::k, Spread::kWholeRow); }
TEST(CpuNan, DecodeNanInOneValueReachesExactlyItsGroup) { check_decode_key_side_nan(&Tensors::v, Spread::kOneColumn); }

// ---- determinism -------------------------------------------------------------------------------------

TEST(CpuDeterminism, ForwardAndBackwardAreBitIdenticalRunToRun) {
  constexpr int kRuns = 3;
  const Problem p = with_mask(dense(2, 4, 2, 130, 100, kHeadDim), true, 40, -1);
  for (DType dtype : kCpuDtypes) {
    for (bool deterministic : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (deterministic ? " deterministic" : ""));
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
      std::vector<std::vector<unsigned char>> first;
      for (int run = 0; run < kRuns; ++run) {
        run_forward(c);
        run_backward(c, deterministic);
        std::vector<std::vector<unsigned char>> now{bytes_of(c.out), bytes_of(c.lse), bytes_of(c.dq), bytes_of(c.dk),
                                                    bytes_of(c.dv)};
        if (run == 0)
          first = now;
        else
          for (size_t n = 0; n < now.size(); ++n) EXPECT_EQ(now[n], first[n]) << "output " << n << ", run " << run;
      }
    }
  }
}

TEST(CpuDeterminism, ResultsDoNotDependOnTheThreadCount) {
  // Each output row is owned by one task, so the partition into threads must not change a bit.
  // The decode splits its keys into parts (forward.cpp, key_parts), which the task count and the
  // keys set, never the thread count. A full mask's forward takes 128-row tasks where every
  // thread gets four of them (forward.cpp, forward_block_rows): 2 x 4 heads x 300 queries make 24,
  // enough for 1, 2 and 5 threads but not for 7, which run 64-row tasks; the rows' bits must not
  // depend on which rows share a task either (the last block of 300 is cut: 44 rows).
  for (const Problem& p : {with_mask(dense(2, 4, 1, 150, 130, kHeadDim), false, 50, 10),
                           dense(1, 8, 2, 1, 4500, kHeadDim), dense(2, 4, 2, 300, 200, kHeadDim)}) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, DType::kFloat32, Layout::kBSHD, rng);
    std::vector<std::vector<unsigned char>> first;
    for (int threads : {1, 2, 5, 7}) {
      c.out.poison();
      c.lse.poison();
      ForwardArgs fa = forward_args(c);
      fa.options.num_threads = threads;
      forward(fa);
      c.dq.poison();
      c.dk.poison();
      c.dv.poison();
      BackwardArgs ba = backward_args(c);
      ba.options.num_threads = threads;
      backward(ba);
      std::vector<std::vector<unsigned char>> now{bytes_of(c.out), bytes_of(c.lse), bytes_of(c.dq), bytes_of(c.dk),
                                                  bytes_of(c.dv)};
      if (first.empty())
        first = now;
      else
        for (size_t n = 0; n < now.size(); ++n)
          EXPECT_EQ(now[n], first[n]) << "output " << n << ", " << threads << " threads, " << p.str();
    }
  }
}

}  // namespace
}  // namespace fusedattn::testing
