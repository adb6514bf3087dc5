// Column-sparse masks (Options::column_mask) on the Hopper forward kernel (MaskKind::kColumn,
// src/cuda/sm90/column_mask.cuh), through the public API. Every case first asserts that dispatch
// sends the call to the sm90 instance, on the 128 x 128 tile without GQA packing (the plan the
// launch makes), then runs it and checks out and lse against the float64 reference of what the
// mask is known to equal: packed causal documents as their variable-length batch (whole key
// blocks skipped, runs of hidden blocks longer than the producer's 32-block scan), windows
// written as columns, per-head masks (each head against its own mask's reference), rows hidden
// from every key (out 0, lse -inf), and masks on top of causal and of a sliding window. Lengths
// are not multiples of the tile, with Sq != Sk both ways; fp16 and bf16 by the 2x rule, fresh
// inputs, outputs poisoned before every run. The backward of these calls is the portable one
// (tests/gpu/test_column_mask.cpp); here only the forward is checked. Skips off Hopper.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/kinds.h"
#include "cuda/dispatch.h"
#include "cuda/sm90/fwd_split.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"
#include "reference/column_mask.h"

namespace fusedattn::testing {
namespace {

// The head dims with a Hopper column instance (tools/gen_instances.py).
constexpr int kHopperColumnHeadDims[] = {64, 128};
constexpr int kHopperColumnTileRows = 128, kHopperColumnTileKeys = 128;

// Causal documents of varied lengths: one row, rows fewer than a block, a block's worth, and
// documents that cross several blocks, so query tiles meet keys of one, two or many documents.
const std::vector<int64_t> kDocuments = {300, 1, 129, 64, 450, 7};

// A dense call with its own causal / window, the problem over the same values whose reference it
// must equal, and the rows the mask hides from every key.
struct MaskedCall {
  Problem call, truth;
  HiddenRows hidden;
};

// The params dispatch sees for `call` with mask m (its values are not read).
FwdParams column_params(const Problem& call, DType dtype, const Columns& m) {
  static const int32_t kAnyBounds[4] = {};
  FwdParams p = planning_params(call, dtype);
  p.column_mask = kAnyBounds;
  p.column_mask_intervals = static_cast<int>(m.intervals);
  p.column_mask_per_head = m.heads == call.heads_q && call.heads_q > 1;
  return p;
}

// Whether dispatch runs `call` with mask m on the Hopper column kernel, on its 128 x 128 tile
// unpacked; "" if so, else why not (a build without the instance says so: the test then skips).
std::string hopper_plan_problem(const Problem& call, DType dtype, const Columns& m) {
  const FwdParams p = column_params(call, dtype, m);
  const cuda::FwdChoice choice = cuda::choose_forward(p, 9, 0);
  if (std::string(choice.arch) != "sm90") return std::string("dispatch chose ") + choice.arch;
  const cuda::sm90::FwdWork work = cuda::sm90::planned_fwd_work(p, cuda::MaskKind::kColumn, choice.instance_head_dim,
                                                                sm_count());
  if (work.shape.block_m != kHopperColumnTileRows || work.shape.block_n != kHopperColumnTileKeys)
    return "tile " + std::to_string(work.shape.block_m) + " x " + std::to_string(work.shape.block_n);
  if (work.rows.packing.shift != 0) return "GQA packed";
  if (work.split.shares != 0) return "tail split";
  if (work.shape.cluster_ctas != 1) return "CTA pairs";
  return "";
}

// Forward only: out and lse of c (run with a column mask) against the reference of `truth` by the
// 2x rule; hidden rows exactly out 0 and lse -inf.
void expect_forward_results(const HostCase& c, const Problem& truth, HiddenRows hidden) {
  const Problem& call = c.problem;
  Tensors ref = c.values, plain = c.values;
  reference_forward(truth, ref);
  plain_forward(truth, c.dtype, plain);
  for (Tensors* t : {&ref, &plain}) {
    zero_rows(t->out, call, call.head_dim, hidden.lo, hidden.hi);
    for (int64_t bh = 0; bh < int64_t{call.batch} * call.heads_q; ++bh)
      std::fill(t->lse.begin() + bh * call.seqlen_q + hidden.lo, t->lse.begin() + bh * call.seqlen_q + hidden.hi,
                -INFINITY);
  }
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  EXPECT_TRUE(obeys_2x_rule(out, plain.out, ref.out, atol_for(c.dtype))) << "out";
  EXPECT_TRUE(obeys_2x_rule(lse, plain.lse, ref.lse, kLseAtol)) << "lse";
  const int64_t row = int64_t{call.heads_q} * call.head_dim;
  for (int64_t b = 0; b < call.batch; ++b)
    for (int64_t i = hidden.lo; i < hidden.hi; ++i) {
      for (int64_t h = 0; h < call.heads_q; ++h)
        ASSERT_EQ(lse[(b * call.heads_q + h) * call.seqlen_q + i], -INFINITY) << "lse of hidden row " << i;
      for (int64_t e = (b * call.seqlen_q + i) * row; e < (b * call.seqlen_q + i + 1) * row; ++e)
        ASSERT_EQ(out[e], 0.0) << "out of hidden row " << i;
    }
}

// Runs mc.call's forward with mask m (after asserting it takes the Hopper kernel) and checks it.
SkipReason check_on_hopper(const MaskedCall& mc, Columns& m, DType dtype) {
  SCOPED_TRACE(mc.call.str() + " " + dtype_name(dtype) + " against " + mc.truth.str());
  if (const char* off = std::getenv("FUSEDATTN_DISABLE_SM90"); off != nullptr && off[0] == '1')
    return std::string("FUSEDATTN_DISABLE_SM90=1: the Hopper kernel is off");
  // A build without a Hopper instance for the call's head dim (FUSEDATTN_SM90=OFF, or head dims
  // left out) runs nothing here; with one, the column-masked call must take it.
  try {
    if (std::string(cuda::choose_forward(planning_params(mc.call, dtype), 9, 0).arch) != "sm90")
      return "no sm90 instance in this build for " + mc.call.str();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  const std::string off_hopper = hopper_plan_problem(mc.call, dtype, m);
  if (!off_hopper.empty()) {
    ADD_FAILURE() << "not on the Hopper column kernel: " << off_hopper;
    return std::nullopt;
  }
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(mc.call, dtype, Layout::kBSHD, rng, kDefaultStddev, /*with_backward=*/false);
  DeviceCase dc(c);
  const DeviceTensor mask(m.bounds);
  ForwardArgs f = dc.forward_args();
  f.options.column_mask = mask.view(m.bounds);
  if (SkipReason skip = dc.forward(f)) return skip;
  expect_forward_results(c, mc.truth, mc.hidden);
  return std::nullopt;
}

// Causal documents packed into one sequence (one mask head shared by every query head): the
// causal call, and the variable-length batch of the documents.
MaskedCall packed_documents(const std::vector<int64_t>& docs, int heads_q, int heads_kv, int d, Columns& m) {
  const int64_t total = total_length(docs);
  hide_later_documents(m, 0, 0, docs);
  return {with_mask(dense(1, heads_q, heads_kv, total, total, d), true, -1, -1),
          with_mask(packed(heads_q, heads_kv, d, docs, docs), true, -1, -1), {}};
}

class GpuSm90ColumnMask : public ::testing::TestWithParam<int> {};

// GQA (4 query heads on 2 KV heads: unpacked all the same), both dtypes.
TEST_P(GpuSm90ColumnMask, PackedCausalDocumentsMatchTheirVarlenBatch) {
  SKIP_UNLESS_HOPPER();
  for (const DType dtype : kGpuDtypes) {
    Columns m(1, 1, total_length(kDocuments), 1);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper(packed_documents(kDocuments, 4, 2, GetParam(), m), m, dtype));
  }
}

// A query tile of the last document sees none of the 35 key blocks before it, so the producer's
// count (32 blocks per load) crosses a chunk with nothing seen in it; a one-token document sits
// between two long ones.
TEST_P(GpuSm90ColumnMask, LongDocumentsSkipRunsOfBlocks) {
  SKIP_UNLESS_HOPPER();
  const std::vector<int64_t> docs = {2500, 1, 1900, 99, 700};
  Columns m(1, 1, total_length(docs), 1);
  const MaskedCall mc = packed_documents(docs, 2, 1, GetParam(), m);
  for (const DType dtype : kGpuDtypes) FUSEDATTN_RUN_OR_SKIP(check_on_hopper(mc, m, dtype));
}

// Causal (square, and Sq != Sk both ways: with more queries than keys the leading rows see no key)
// and sliding windows written as two intervals per key, on an unmasked call. One mask head
// shared by every query head and one per query head take turns.
TEST_P(GpuSm90ColumnMask, WindowsWrittenAsColumns) {
  SKIP_UNLESS_HOPPER();
  struct Window {
    int64_t sq, sk, left, right;
  };
  int turn = 0;
  for (const Window& w : {Window{577, 577, -1, 0}, Window{301, 1100, -1, 0}, Window{1000, 257, -1, 0},
                          Window{700, 700, 150, 30}, Window{450, 900, 200, 0}, Window{390, 520, -1, 70}}) {
    for (const DType dtype : kGpuDtypes) {
      const int64_t mask_heads = turn++ % 2 == 0 ? 1 : 4;
      SCOPED_TRACE("mask heads " + std::to_string(mask_heads));
      const Problem call = dense(2, 4, 2, w.sq, w.sk, GetParam());
      Columns m(2, mask_heads, w.sk, 2);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < mask_heads; ++h) hide_outside_window(m, b, h, w.sq, w.sk, w.left, w.right);
      FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, with_mask(call, false, w.left, w.right), {}}, m, dtype));
    }
  }
}

// A sliding window of 100 keys written as columns over 4500 keys of an unmasked call: the
// window's range is every block, so a tile near the top walks down through a whole chunk of 32
// hidden blocks (and part of another) before it reaches the blocks it sees, and its last chunk
// reaches below block 0 (lanes past the range read nothing).
TEST_P(GpuSm90ColumnMask, SlidingWindowAcrossScanChunks) {
  SKIP_UNLESS_HOPPER();
  const int64_t s = 4500;
  const Problem call = dense(1, 2, 1, s, s, GetParam());
  Columns m(1, 1, s, 2);
  hide_outside_window(m, 0, 0, s, s, 100, 0);
  const DType dtype = GetParam() == kHopperColumnHeadDims[0] ? DType::kFloat16 : DType::kBFloat16;
  FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, with_mask(call, false, 100, 0), {}}, m, dtype));
}

// Per-head masks: each query head its own window (a GQA call whose groups mix them), so a tile
// that read another head's mask would see the wrong keys. Each head is checked against the
// reference of its own window, on the same values.
TEST_P(GpuSm90ColumnMask, EachHeadReadsItsOwnMask) {
  SKIP_UNLESS_HOPPER();
  constexpr int kHeads = 4;
  struct Window {
    int64_t left, right;
  };
  const Window windows[kHeads] = {{-1, 0}, {-1, -1}, {100, 0}, {40, 200}};
  const int64_t sq = 517, sk = 645;
  const Problem call = dense(1, kHeads, 2, sq, sk, GetParam());
  for (const DType dtype : kGpuDtypes) {
    SCOPED_TRACE(call.str() + " " + dtype_name(dtype));
    Columns m(1, kHeads, sk, 2);
    for (int64_t h = 0; h < kHeads; ++h) hide_outside_window(m, 0, h, sq, sk, windows[h].left, windows[h].right);
    const std::string off_hopper = hopper_plan_problem(call, dtype, m);
    if (!off_hopper.empty()) GTEST_SKIP() << "not on the Hopper column kernel: " << off_hopper;
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(call, dtype, Layout::kBSHD, rng, kDefaultStddev, /*with_backward=*/false);
    DeviceCase dc(c);
    const DeviceTensor mask(m.bounds);
    ForwardArgs f = dc.forward_args();
    f.options.column_mask = mask.view(m.bounds);
    FUSEDATTN_RUN_OR_SKIP(dc.forward(f));
    const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
    const int64_t d = GetParam();
    for (int64_t h = 0; h < kHeads; ++h) {
      SCOPED_TRACE("head " + std::to_string(h));
      const Problem truth = with_mask(call, false, windows[h].left, windows[h].right);
      Tensors ref = c.values, plain = c.values;
      reference_forward(truth, ref);
      plain_forward(truth, dtype, plain);
      // Head h's elements: out [sq, heads, d], lse [heads, sq].
      std::vector<double> got_out, want_out, plain_out, got_lse, want_lse, plain_lse;
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t e = 0; e < d; ++e) {
          const size_t at = static_cast<size_t>((i * kHeads + h) * d + e);
          got_out.push_back(out[at]);
          want_out.push_back(ref.out[at]);
          plain_out.push_back(plain.out[at]);
        }
      for (int64_t i = 0; i < sq; ++i) {
        const size_t at = static_cast<size_t>(h * sq + i);
        got_lse.push_back(lse[at]);
        want_lse.push_back(ref.lse[at]);
        plain_lse.push_back(plain.lse[at]);
      }
      EXPECT_TRUE(obeys_2x_rule(got_out, plain_out, want_out, atol_for(dtype))) << "out";
      EXPECT_TRUE(obeys_2x_rule(got_lse, plain_lse, want_lse, kLseAtol)) << "lse";
    }
  }
}

// Every key hides from rows [100, 333), which start inside a query tile and end inside another:
// out 0 and lse -inf there, and the other rows as if those were not there. Tiles of hidden rows
// only see no block at all (the announcement's count is 0).
TEST_P(GpuSm90ColumnMask, RowsHiddenFromEveryKeyAreFullyMasked) {
  SKIP_UNLESS_HOPPER();
  const int64_t sq = 500, sk = 700;
  const HiddenRows hidden{100, 333};
  const Problem call = dense(2, 2, 1, sq, sk, GetParam());
  for (const DType dtype : kGpuDtypes) {
    Columns m(2, 1, sk, 2);
    for (int64_t b = 0; b < 2; ++b) hide_rows_from_every_key(m, b, 0, hidden.lo, hidden.hi);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, call, hidden}, m, dtype));
  }
}

// A column mask on top of the call's causal mask and of its sliding window: a key is seen where
// both allow it, so each call equals the window that intersects them (blocks cut by the window,
// by the mask, or by both). Then documents with a window on top: each key hides from the rows
// before and after its document (two intervals), which is the documents' variable-length batch
// with that window.
TEST_P(GpuSm90ColumnMask, OnTopOfCausalAndSlidingWindows) {
  SKIP_UNLESS_HOPPER();
  const int d = GetParam();
  struct Layered {
    int64_t sq, sk;
    bool causal;
    int64_t call_left, call_right, mask_left, mask_right, left, right;  // left, right: the intersection
  };
  int turn = 0;
  for (const Layered& l :
       {Layered{611, 800, true, -1, -1, 90, -1, 90, 0}, Layered{800, 611, true, -1, -1, 90, -1, 90, 0},
        Layered{650, 650, false, 300, 40, 80, -1, 80, 40}, Layered{420, 700, false, 60, -1, -1, 0, 60, 0}}) {
    const Problem call = with_mask(dense(2, 4, 2, l.sq, l.sk, d), l.causal, l.call_left, l.call_right);
    const Problem truth = with_mask(dense(2, 4, 2, l.sq, l.sk, d), false, l.left, l.right);
    const DType dtype = kGpuDtypes[turn++ % 2];
    Columns m(2, 1, l.sk, 2);
    for (int64_t b = 0; b < 2; ++b) hide_outside_window(m, b, 0, l.sq, l.sk, l.mask_left, l.mask_right);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, truth, {}}, m, dtype));
  }
  const int64_t total = total_length(kDocuments);
  for (const DType dtype : kGpuDtypes) {
    Columns m(1, 1, total, 2);
    int64_t start = 0;
    for (const int64_t n : kDocuments) {
      for (int64_t j = start; j < start + n; ++j) {
        m.hide(0, 0, j, 0, 0, start);
        m.hide(0, 0, j, 1, start + n, total);
      }
      start += n;
    }
    const MaskedCall mc{with_mask(dense(1, 4, 2, total, total, d), false, 100, 20),
                        with_mask(packed(4, 2, d, kDocuments, kDocuments), false, 100, 20), {}};
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper(mc, m, dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuSm90ColumnMask, ::testing::ValuesIn(kHopperColumnHeadDims),
                         [](const ::testing::TestParamInfo<int>& info) { return "d" + std::to_string(info.param); });

// FUSEDATTN_DISABLE_SM90=1 still sends column-masked calls to the portable kernels, and head dims
// without a Hopper column instance of their own stay there (a host-side plan; no kernel runs).
TEST(GpuSm90ColumnMaskPlan, SwitchAndOtherHeadDimsStayPortable) {
  SKIP_UNLESS_HOPPER();
  Columns m(1, 1, 300, 1);
  const Problem call = with_mask(dense(1, 2, 2, 300, 300, 128), true, -1, -1);
  {
    const ScopedEnv off("FUSEDATTN_DISABLE_SM90", "1");
    try {
      EXPECT_STREQ(cuda::choose_forward(column_params(call, DType::kFloat16, m), 9, 0).arch, "sm80");
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
  }
  for (const int d : {32, 96, 192, 256}) {
    try {
      const FwdParams params = column_params(dense(1, 2, 2, 300, 300, d), DType::kFloat16, m);
      const cuda::FwdChoice choice = cuda::choose_forward(params, 9, 0);
      if (std::string(choice.arch) == "sm90") {
        bool hopper_instance = false;
        for (const int h : kHopperColumnHeadDims) hopper_instance = hopper_instance || choice.instance_head_dim == h;
        EXPECT_TRUE(hopper_instance) << "d" << d << " on sm90 d" << choice.instance_head_dim;
      }
    } catch (const Error&) {
      // No instance at all for d in this build.
    }
  }
}

// The small case compute-sanitizer runs (its filter GpuSanitizer.* picks this up): packed causal
// documents, and a window written as columns on top of causal, at d64 and d128 (ragged last
// tiles, both K rings wrapping); fp16.
TEST(GpuSanitizer, Sm90ColumnMaskSmallDocuments) {
  SKIP_UNLESS_HOPPER();
  for (const int d : kHopperColumnHeadDims) {
    const std::vector<int64_t> docs = {130, 1, 300, 40, 70};
    Columns m(1, 1, total_length(docs), 1);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper(packed_documents(docs, 2, 1, d, m), m, DType::kFloat16));
    const int64_t s = 333;
    Columns w(1, 1, s, 2);
    hide_outside_window(w, 0, 0, s, s, 50, -1);
    const Problem call = with_mask(dense(1, 2, 2, s, s, d), true, -1, -1);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, with_mask(call, false, 50, 0), {}}, w, DType::kFloat16));
  }
}

}  // namespace
}  // namespace fusedattn::testing
