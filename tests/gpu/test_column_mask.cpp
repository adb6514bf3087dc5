// Column-sparse masks (Options::column_mask) on the CUDA backend, through the public API: the
// portable forward and backward kernels, and on Hopper the sm90 forward where it has the head dim
// (ColumnCase; test_sm90_column.cpp asserts that plan); each mask is checked against the float64
// reference of what it is known to equal: windows written as columns, packed causal documents as
// their variable-length batch (whole key blocks skipped), per-head masks (each head against the
// reference of its own mask), rows hidden from every key (out 0, lse -inf, no gradient), and masks
// on top of causal and of a sliding window. Lengths span many query and key blocks with ragged
// tails; fp16 and bf16 by the 2x rule, fresh inputs, outputs poisoned before every run; the
// deterministic backward is bit-identical run to run. Then the rejections, by name.
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "reference/column_mask.h"

namespace fusedattn::testing {
namespace {

// Causal documents of varied lengths: one row, rows fewer than a block, a block's worth, and
// documents that cross several blocks, so query blocks meet keys of one, two or many documents.
const std::vector<int64_t> kDocuments = {300, 1, 129, 64, 450, 7};

constexpr int kDeterminismRuns = 2;

// Runs mc.call forward and backward with column mask m (uploaded to the device) and checks it
// against mc.truth; with `deterministic`, the backward runs kDeterminismRuns times and must give
// the same bytes.
SkipReason check_masked(const MaskedCall& mc, Columns& m, DType dtype, bool deterministic = false) {
  SCOPED_TRACE(mc.call.str() + " " + dtype_name(dtype) + " against " + mc.truth.str());
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(mc.call, dtype, Layout::kBSHD, rng);
  DeviceCase dc(c);
  const DeviceTensor mask(m.bounds);
  ForwardArgs f = dc.forward_args();
  f.options.column_mask = mask.view(m.bounds);
  if (SkipReason skip = dc.forward(f)) return skip;
  BackwardArgs a = dc.backward_args();
  a.options.column_mask = f.options.column_mask;
  a.deterministic = deterministic;
  if (SkipReason skip = dc.backward(a)) return skip;
  if (deterministic) {
    const std::vector<unsigned char> dq = bytes_of(c.dq), dk = bytes_of(c.dk), dv = bytes_of(c.dv);
    for (int run = 1; run < kDeterminismRuns; ++run) {
      if (SkipReason skip = dc.backward(a)) return skip;
      EXPECT_EQ(bytes_of(c.dq), dq) << "dq differs on run " << run;
      EXPECT_EQ(bytes_of(c.dk), dk) << "dk differs on run " << run;
      EXPECT_EQ(bytes_of(c.dv), dv) << "dv differs on run " << run;
    }
  }
  expect_masked_results(c, mc.truth, mc.hidden, atol_for(dtype), kLseAtol);
  return std::nullopt;
}

// On Hopper the forward takes the sm90 kernel at the head dims it has a column instance for
// (test_sm90_column.cpp asserts that plan) and the portable kernels run only the backward, so each
// case also runs with the portable forward forced.
struct ColumnCase {
  int head_dim;
  bool portable;
};

// The tests for the head dims most models use; each skips where this build lacks its instance.
class GpuColumnMask : public ::testing::TestWithParam<ColumnCase> {
 protected:
  GpuColumnMask() : portable_("FUSEDATTN_DISABLE_SM90", GetParam().portable ? "1" : "0") {}
  static int head_dim() { return GetParam().head_dim; }

 private:
  ScopedEnv portable_;
};

// Causal (square, and Sq != Sk both ways: with more queries than keys the leading rows see no key)
// and sliding windows, written as two intervals per key. One mask head shared by every query head
// of a GQA call and one per query head take turns over the windows and the dtypes, so that each
// window and each dtype meets both.
TEST_P(GpuColumnMask, WindowsWrittenAsColumns) {
  FUSEDATTN_REQUIRE_GPU();
  struct Window {
    int64_t sq, sk, left, right;
  };
  int first_turn = 0;
  for (const Window& w : {Window{577, 577, -1, 0}, Window{301, 1100, -1, 0}, Window{1000, 257, -1, 0},
                          Window{700, 700, 150, 30}, Window{450, 900, 200, 0}, Window{390, 520, -1, 70}}) {
    int turn = first_turn++;
    for (const DType dtype : kGpuDtypes) {
      const int64_t mask_heads = turn++ % 2 == 0 ? 1 : 4;
      SCOPED_TRACE("mask heads " + std::to_string(mask_heads));
      const Problem call = dense(2, 4, 2, w.sq, w.sk, head_dim());
      Columns m(2, mask_heads, w.sk, 2);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < mask_heads; ++h) hide_outside_window(m, b, h, w.sq, w.sk, w.left, w.right);
      FUSEDATTN_RUN_OR_SKIP(check_masked({call, with_mask(call, false, w.left, w.right), {}}, m, dtype));
    }
  }
}

// Query blocks past a document's end skip its key blocks whole; the rest are cut at document
// boundaries that fall inside blocks. Forward and backward, both dtypes, at head_dim.
void check_packed_documents(int head_dim) {
  for (const DType dtype : kGpuDtypes) {
    Columns m(1, 1, total_length(kDocuments), 1);
    const MaskedCall mc = packed_documents(kDocuments, 4, 2, head_dim, m);
    FUSEDATTN_RUN_OR_SKIP(check_masked(mc, m, dtype));
  }
}

TEST_P(GpuColumnMask, PackedCausalDocumentsMatchTheirVarlenBatch) {
  FUSEDATTN_REQUIRE_GPU();
  check_packed_documents(head_dim());
}

// Long documents: a query block of the last one sees nothing of the first, a run of more than 32
// hidden key blocks, so the forward's scan (32 blocks per load) crosses windows before it finds
// none left; and the backward leaves out the rows after each key block's document.
TEST_P(GpuColumnMask, LongDocumentsSkipRunsOfBlocks) {
  FUSEDATTN_REQUIRE_GPU();
  const std::vector<int64_t> docs = {2500, 1, 1900, 99, 700};
  Columns m(1, 1, total_length(docs), 1);
  const MaskedCall mc = packed_documents(docs, 2, 1, head_dim(), m);
  FUSEDATTN_RUN_OR_SKIP(check_masked(mc, m, DType::kBFloat16));
}

// Documents shorter than a key block, so that cut blocks hold from one run of equal bounds to more
// than the summary keeps (kColumnRunsMax): eight of 16 keys fill a 128-key block with eight runs,
// nine of 14 make more (masked key by key); runs cross the summary kernel's 32-key chunks, and
// documents of one key make runs of one. Forward and backward.
TEST_P(GpuColumnMask, ShortDocumentsMaskedRunByRun) {
  FUSEDATTN_REQUIRE_GPU();
  std::vector<int64_t> docs(8, 16);
  docs.insert(docs.end(), 9, 14);
  for (const int64_t len : {1, 2, 3, 5, 30, 17, 33, 64, 7, 1, 100}) docs.push_back(len);
  Columns m(1, 1, total_length(docs), 1);
  const MaskedCall mc = packed_documents(docs, 4, 2, head_dim(), m);
  FUSEDATTN_RUN_OR_SKIP(check_masked(mc, m, DType::kFloat16));
}

TEST_P(GpuColumnMask, DeterministicBackwardOfDocumentsIsBitIdentical) {
  FUSEDATTN_REQUIRE_GPU();
  for (const DType dtype : kGpuDtypes) {
    Columns m(1, 1, total_length(kDocuments), 1);
    const MaskedCall mc = packed_documents(kDocuments, 4, 2, head_dim(), m);
    FUSEDATTN_RUN_OR_SKIP(check_masked(mc, m, dtype, /*deterministic=*/true));
  }
}

// A mask whose spans fall with the key block: key j is seen by rows [s - 1 - j, s) only, so a
// later key block reaches further back. The deterministic backward then cannot leave a KV block's
// unseen query blocks out (sm80/bwd_column_spans.cuh: the blocks adding into a query block would
// not be consecutive); every block of the window adds in turn, the hidden ones masked whole. Both
// backwards against the reference of what the mask equals (reversed_causal_references); the
// deterministic one is bit-identical run to run and equals the default's (atomic adds, unseen query
// blocks left out) up to the order of the fp32 dQ sums.
TEST_P(GpuColumnMask, DeterministicBackwardWhereSpansFallMatchesTheDefault) {
  FUSEDATTN_REQUIRE_GPU();
  const int64_t s = 600;
  for (const DType dtype : kGpuDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    Columns m(1, 1, s, 1);
    hide_before_the_reversed_diagonal(m, 0, 0);
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(dense(1, 4, 2, s, s, head_dim()), dtype, Layout::kBSHD, rng);
    DeviceCase dc(c);
    const DeviceTensor mask(m.bounds);
    ForwardArgs f = dc.forward_args();
    f.options.column_mask = mask.view(m.bounds);
    FUSEDATTN_RUN_OR_SKIP(dc.forward(f));
    BackwardArgs a = dc.backward_args();
    a.options.column_mask = f.options.column_mask;
    FUSEDATTN_RUN_OR_SKIP(dc.backward(a));
    Tensors ref, plain;
    reversed_causal_references(c, ref, plain);
    const double atol = atol_for(dtype);
    EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol)) << "out";
    EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse";
    const std::vector<double> dq = gather_dense(c.dq.view()), dk = gather_dense(c.dk.view()),
                              dv = gather_dense(c.dv.view());
    a.deterministic = true;
    FUSEDATTN_RUN_OR_SKIP(dc.backward(a));
    const std::vector<unsigned char> first_run = bytes_of(c.dq);
    const auto expect_both = [atol](const char* name, const std::vector<double>& deterministic,
                                    const std::vector<double>& by_default, const std::vector<double>& want,
                                    const std::vector<double>& want_plain) {
      EXPECT_TRUE(obeys_2x_rule(by_default, want_plain, want, atol)) << name << " of the default backward";
      EXPECT_TRUE(obeys_2x_rule(deterministic, want_plain, want, atol)) << name << " of the deterministic backward";
    };
    expect_both("dq", c.dq.to_double(), dq, ref.dq, plain.dq);
    expect_both("dk", c.dk.to_double(), dk, ref.dk, plain.dk);
    expect_both("dv", c.dv.to_double(), dv, ref.dv, plain.dv);
    constexpr double kAtol = 1e-3, kRtol = 1e-2;  // a few units in the last place of fp16 / bf16
    EXPECT_TRUE(all_close(gather_dense(c.dq.view()), dq, kAtol, kRtol)) << "dq";
    EXPECT_TRUE(all_close(gather_dense(c.dk.view()), dk, kAtol, kRtol)) << "dk";
    EXPECT_TRUE(all_close(gather_dense(c.dv.view()), dv, kAtol, kRtol)) << "dv";
    FUSEDATTN_RUN_OR_SKIP(dc.backward(a));
    EXPECT_EQ(bytes_of(c.dq), first_run) << "dq differs on the second deterministic run";
  }
}

// Element indices of query heads h with h % 2 == parity in canonical values laid out
// [outer, heads, inner] (out, dout, dq: inner = head_dim; lse: outer = batch, inner = seqlen_q).
std::vector<size_t> heads_of_parity(size_t size, int64_t heads, int64_t inner, int64_t parity) {
  std::vector<size_t> at;
  for (size_t e = 0; e < size; ++e)
    if ((static_cast<int64_t>(e) / inner) % heads % 2 == parity) at.push_back(e);
  return at;
}

// Per-head masks over a GQA call whose groups mix them: even heads causal, odd heads unmasked
// (their intervals empty: start equal to or above end). Gradients are linear in dout, so each
// parity's reference with the other parity's dout zeroed gives that parity's share of dq, dk and
// dv, and the two shares add up to the call's (dk and dv sum both parities over a group).
TEST_P(GpuColumnMask, EachHeadReadsItsOwnMask) {
  FUSEDATTN_REQUIRE_GPU();
  const int d = head_dim();
  constexpr int kHeads = 4;
  const int64_t s = 517;
  const Problem call = dense(1, kHeads, 2, s, s, d);
  for (const DType dtype : kGpuDtypes) {
    SCOPED_TRACE(call.str() + " " + dtype_name(dtype));
    Columns m(1, kHeads, s, 1);
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t j = 0; j < s; ++j) h % 2 == 0 ? m.hide(0, h, j, 0, 0, j) : m.hide(0, h, j, 0, j + j % 3, j);
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(call, dtype, Layout::kBSHD, rng);
    DeviceCase dc(c);
    const DeviceTensor mask(m.bounds);
    ForwardArgs f = dc.forward_args();
    f.options.column_mask = mask.view(m.bounds);
    BackwardArgs a = dc.backward_args();
    a.options.column_mask = f.options.column_mask;
    FUSEDATTN_RUN_OR_SKIP(dc.forward(f));
    FUSEDATTN_RUN_OR_SKIP(dc.backward(a));

    Tensors want, want_plain;
    for (Tensors* t : {&want, &want_plain}) {
      t->out.assign(c.values.q.size(), 0.0);
      t->lse.assign(static_cast<size_t>(kHeads * s), 0.0);
      t->dq.assign(c.values.q.size(), 0.0);
      t->dk.assign(c.values.k.size(), 0.0);
      t->dv.assign(c.values.v.size(), 0.0);
    }
    for (const int64_t parity : {0, 1}) {
      const Problem truth = with_mask(call, parity == 0, -1, -1);
      Tensors ref = c.values, plain = c.values;
      for (const size_t e : heads_of_parity(c.values.dout.size(), kHeads, d, 1 - parity))
        ref.dout[e] = plain.dout[e] = 0.0;
      reference_forward(truth, ref);
      reference_backward(truth, ref);
      plain_forward(truth, dtype, plain);
      plain_backward(truth, dtype, plain);
      for (const auto& [into, from] : {std::pair{&want, &ref}, std::pair{&want_plain, &plain}}) {
        for (const size_t e : heads_of_parity(from->out.size(), kHeads, d, parity)) into->out[e] = from->out[e];
        for (const size_t e : heads_of_parity(from->lse.size(), kHeads, s, parity)) into->lse[e] = from->lse[e];
        for (size_t e = 0; e < into->dq.size(); ++e) into->dq[e] += from->dq[e];
        for (size_t e = 0; e < into->dk.size(); ++e) {
          into->dk[e] += from->dk[e];
          into->dv[e] += from->dv[e];
        }
      }
    }
    const double atol = atol_for(dtype);
    EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), want_plain.out, want.out, atol)) << "out";
    EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), want_plain.lse, want.lse, kLseAtol)) << "lse";
    EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), want_plain.dq, want.dq, atol)) << "dq";
    EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), want_plain.dk, want.dk, atol)) << "dk";
    EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), want_plain.dv, want.dv, atol)) << "dv";
  }
}

// Every key hides from rows [100, 333), which start inside a query block and end inside another
// several blocks on: out 0, lse -inf and dq 0 there, and the other rows' results and dk, dv as if
// those rows were not there.
TEST_P(GpuColumnMask, RowsHiddenFromEveryKeyAreFullyMasked) {
  FUSEDATTN_REQUIRE_GPU();
  const int64_t sq = 500, sk = 700;
  const HiddenRows hidden{100, 333};
  const Problem call = dense(2, 2, 1, sq, sk, head_dim());
  for (const DType dtype : kGpuDtypes) {
    Columns m(2, 1, sk, 2);
    for (int64_t b = 0; b < 2; ++b) hide_rows_from_every_key(m, b, 0, hidden.lo, hidden.hi);
    FUSEDATTN_RUN_OR_SKIP(check_masked({call, call, hidden}, m, dtype));
  }
}

// A column mask on top of the call's causal mask and of its sliding window: a key is seen where
// both allow it, so each call equals the window that intersects them. Then documents with a
// window: each key hides from the rows before and after its document (two intervals), which is
// the variable-length batch of the documents with that window.
TEST_P(GpuColumnMask, OnTopOfCausalAndSlidingWindows) {
  FUSEDATTN_REQUIRE_GPU();
  const int d = head_dim();
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
    FUSEDATTN_RUN_OR_SKIP(check_masked({call, truth, {}}, m, dtype));
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
    FUSEDATTN_RUN_OR_SKIP(check_masked(mc, m, dtype));
  }
}

std::string column_case_name(const ::testing::TestParamInfo<ColumnCase>& info) {
  return "d" + std::to_string(info.param.head_dim) + (info.param.portable ? "_portable" : "");
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuColumnMask,
                         ::testing::Values(ColumnCase{64, false}, ColumnCase{64, true}, ColumnCase{128, false},
                                           ColumnCase{128, true}),
                         column_case_name);

// No keys at all (seqlen_k 0, an empty mask): every row is fully masked, forward and backward;
// the forward has no key block to summarise.
TEST_P(GpuColumnMask, NoKeysMaskEveryRow) {
  FUSEDATTN_REQUIRE_GPU();
  for (const DType dtype : kGpuDtypes) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(dense(2, 2, 1, 10, 0, head_dim()), dtype, Layout::kBSHD, rng);
    DeviceCase dc(c);
    Columns m(2, 1, 0, 1);
    const DeviceTensor mask(m.bounds);
    ForwardArgs f = dc.forward_args();
    f.options.column_mask = mask.view(m.bounds);
    FUSEDATTN_RUN_OR_SKIP(dc.forward(f));
    for (double x : c.out.to_double()) ASSERT_EQ(x, 0.0);
    for (double x : c.lse.to_double()) ASSERT_EQ(x, -INFINITY);
    BackwardArgs a = dc.backward_args();
    a.options.column_mask = f.options.column_mask;
    FUSEDATTN_RUN_OR_SKIP(dc.backward(a));
    for (double x : c.dq.to_double()) ASSERT_EQ(x, 0.0);
  }
}

// The other head dims, where this build compiles them: packed causal documents, forward and
// backward.
class GpuColumnMaskOtherHeadDims : public ::testing::TestWithParam<int> {};

TEST_P(GpuColumnMaskOtherHeadDims, PackedCausalDocuments) {
  FUSEDATTN_REQUIRE_GPU();
  check_packed_documents(GetParam());
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuColumnMaskOtherHeadDims, ::testing::Values(32, 96, 192, 256),
                         [](const ::testing::TestParamInfo<int>& info) { return "d" + std::to_string(info.param); });

// The forward and the backward of a valid fp16 case p, given `mask` as their column mask: each
// must throw `code` naming column_mask, with `what` in its message.
void expect_rejected(const Problem& p, const TensorView& mask, ErrorCode code, const char* what) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, DType::kFloat16, Layout::kBSHD, rng);
  DeviceCase dc(c);
  ForwardArgs f = dc.forward_args();
  f.options.column_mask = mask;
  BackwardArgs b = dc.backward_args();
  b.options.column_mask = mask;
  expect_error([&] { forward(f); }, code, "column_mask", what);
  expect_error([&] { backward(b); }, code, "column_mask", what);
}

TEST(GpuColumnMaskErrors, VarlenCallsAreRejectedByName) {
  FUSEDATTN_REQUIRE_GPU();
  Columns m(2, 1, 7, 1);
  const DeviceTensor mask(m.bounds);
  expect_rejected(packed(2, 1, 64, {5, 7}, {5, 7}), mask.view(m.bounds), ErrorCode::kUnsupported, "dense calls only");
}

TEST(GpuColumnMaskErrors, HostMaskWithDeviceTensorsIsADeviceMismatch) {
  FUSEDATTN_REQUIRE_GPU();
  Columns m(2, 1, 50, 1);
  expect_rejected(dense(2, 4, 2, 40, 50, 64), m.view(), ErrorCode::kDeviceMismatch, "same device as q");
}

// Captured into a CUDA graph on a stream the library has never seen (torch's CUDA graphs do
// this): the forward's per-stream summary buffer cannot grow during the capture, so the graph
// allocates the summary itself (stream-ordered). Then, once an eager call on the stream has sized
// the buffer, a second capture uses the buffer. Every replay must match the reference.
TEST(GpuColumnMaskGraphs, ForwardCapturedOnAFreshStream) {
  FUSEDATTN_REQUIRE_GPU();
  Columns m(1, 1, total_length(kDocuments), 1);
  const MaskedCall mc = packed_documents(kDocuments, 4, 2, 64, m);
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(mc.call, DType::kFloat16, Layout::kBSHD, rng);
  DeviceCase dc(c);
  const DeviceTensor mask(m.bounds);
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  ForwardArgs f = dc.forward_args();
  f.options.column_mask = mask.view(m.bounds);
  f.options.stream = stream;
  Tensors ref = c.values, plain = c.values;
  reference_forward(mc.truth, ref);
  plain_forward(mc.truth, c.dtype, plain);
  for (const bool sized : {false, true}) {
    SCOPED_TRACE(sized ? "after an eager call" : "on a fresh stream");
    if (sized) {
      FUSEDATTN_RUN_OR_SKIP(run_unless_missing([&] { fusedattn::forward(f); }));
      cuda_check(cudaStreamSynchronize(stream), "eager call");
    }
    SkipReason skip;
    const CapturedGraph graph(stream, [&] { skip = run_unless_missing([&] { fusedattn::forward(f); }); });
    if (skip) GTEST_SKIP() << *skip;
    constexpr int kReplays = 2;
    for (int replay = 0; replay < kReplays; ++replay) {
      dc.out.poison();
      dc.lse.poison();
      graph.replay();
      dc.out.download(c.out);
      dc.lse.download(c.lse);
      EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(c.dtype))) << "out, replay " << replay;
      EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse, replay " << replay;
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace fusedattn::testing
