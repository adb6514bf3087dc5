// Every check of src/api/validate.cpp: the thrown fusedattn::Error's code, the argument it names,
// and that its message says what is accepted. Each test starts from a valid call and breaks one
// thing, so a check that fires for the wrong reason would name the wrong argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "cpu/cpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kHeadDim = 16;
const Device kGpu0{DeviceType::kCUDA, 0};

// A small valid dense or varlen case whose forward and backward both succeed.
struct Valid {
  HostCase c;
  ForwardArgs fwd;
  BackwardArgs bwd;
};

Valid valid_case(const Problem& p) {
  std::mt19937_64 rng = fresh_rng();
  Valid v{make_case(p, DType::kFloat32, Layout::kBSHD, rng), {}, {}};
  v.fwd = forward_args(v.c);
  v.bwd = backward_args(v.c);
  return v;
}

Valid valid_dense() { return valid_case(dense(2, 4, 2, 6, 5, kHeadDim)); }
Valid valid_varlen() { return valid_case(packed(4, 2, kHeadDim, {3, 0, 4}, {2, 5, 1})); }

void expect_fwd_error(const ForwardArgs& a, ErrorCode code, const std::string& argument, const std::string& mentions) {
  expect_error([&] { forward(a); }, code, argument, mentions);
}
void expect_bwd_error(const BackwardArgs& a, ErrorCode code, const std::string& argument, const std::string& mentions) {
  expect_error([&] { backward(a); }, code, argument, mentions);
}

TEST(Validation, TheBaselineCallsAreValid) {
  for (Valid v : {valid_dense(), valid_varlen()}) {
    EXPECT_NO_THROW(forward(v.fwd));
    EXPECT_NO_THROW(backward(v.bwd));
  }
}

// ---- tensors -----------------------------------------------------------------------------------

TEST(Validation, NullDataPointer) {
  Valid v = valid_dense();
  v.fwd.k.data = nullptr;
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "k", "null");
}

TEST(Validation, WrongRank) {
  Valid v = valid_dense();
  v.fwd.q.rank = 3;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "q", "[batch, seqlen, heads, head_dim]");
  Valid w = valid_varlen();
  w.fwd.v = v.c.v.view();  // a rank-4 tensor in a varlen call
  expect_fwd_error(w.fwd, ErrorCode::kShapeMismatch, "v", "[total_tokens, heads, head_dim]");
}

TEST(Validation, NegativeSize) {
  Valid v = valid_dense();
  v.fwd.out.shape[1] = -1;
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "out", "negative size");
}

TEST(Validation, LastDimensionNotContiguous) {
  Valid v = valid_dense();
  v.fwd.q.stride[3] = 2;
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "q", "stride 1");
}

TEST(Validation, NegativeStride) {
  Valid v = valid_dense();
  v.fwd.k.stride[1] = -v.fwd.k.stride[1];
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "k", "negative stride");
}

// A rank the view does not have is reported as such, before any size or pointer is read.
TEST(Validation, RankAboveTheViewsDimensionsBeforeTheNullCheck) {
  Valid v = valid_dense();
  v.fwd.q.rank = 9;
  v.fwd.q.data = nullptr;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "q", "rank 9");
}

// Sizes whose product overflows int64 do not reach a multiplication.
TEST(Validation, NullDataWithHugeSizes) {
  Valid v = valid_dense();
  v.fwd.out.data = nullptr;
  v.fwd.out.shape[0] = v.fwd.out.shape[1] = int64_t{1} << 40;
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "out", "null");
}

// Written tensors must not map two elements to one address: a stride-0 (expanded) dimension
// would have several threads write it. Read tensors may be expanded.
TEST(Validation, WrittenTensorsWithStrideZero) {
  Valid v = valid_dense();
  v.fwd.out.stride[1] = 0;
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "out", "stride 0");
  v = valid_dense();
  v.fwd.lse.stride[1] = 0;
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "lse", "stride 0");
  const std::pair<TensorView BackwardArgs::*, const char*> gradients[] = {
      {&BackwardArgs::dq, "dq"}, {&BackwardArgs::dk, "dk"}, {&BackwardArgs::dv, "dv"}};
  for (const auto& [gradient, name] : gradients) {
    Valid b = valid_dense();
    (b.bwd.*gradient).stride[2] = 0;
    expect_bwd_error(b.bwd, ErrorCode::kLayout, name, "stride 0");
  }
}

// Nor may their dimensions overlap otherwise: two threads would write one address just the same.
// The valid case's out is [2, 6, 4, 16], its lse [2, 4, 6], contiguous.
TEST(Validation, WrittenTensorsWhoseDimensionsOverlap) {
  Valid v = valid_dense();
  v.fwd.out.stride[2] = 8;  // each head's last 8 elements are the next head's first
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "out", "dimension 2 (size 4, stride 8) overlaps");
  v = valid_dense();
  v.fwd.out.stride[1] = 60;  // a row's heads reach offset 63
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "out", "reach offset 63");
  v = valid_dense();
  v.fwd.lse.stride[1] = 5;  // heads of 6 rows, 5 apart
  expect_fwd_error(v.fwd, ErrorCode::kLayout, "lse", "overlaps");
  const std::pair<TensorView BackwardArgs::*, const char*> gradients[] = {
      {&BackwardArgs::dq, "dq"}, {&BackwardArgs::dk, "dk"}, {&BackwardArgs::dv, "dv"}};
  for (const auto& [gradient, name] : gradients) {
    Valid b = valid_dense();
    (b.bwd.*gradient).stride[2] = kHeadDim - 1;
    expect_bwd_error(b.bwd, ErrorCode::kLayout, name, "overlaps");
  }
  // The check orders dimensions by stride, so the layouts views take pass: heads first in memory
  // ([B, H, S, D] viewed as [B, S, H, D]), and rows with room to spare.
  v = valid_dense();
  std::vector<float> wide(static_cast<size_t>(2 * 6 * 4 * 2 * kHeadDim));
  v.fwd.out = TensorView::contiguous(wide.data(), DType::kFloat32, {2, 4, 6, 2 * kHeadDim}).transposed(1, 2);
  v.fwd.out.shape[3] = kHeadDim;  // each row's first half
  EXPECT_NO_THROW(forward(v.fwd));
}

// Nor may a written tensor share a byte with another tensor of the call: the kernels read their
// inputs while they write (the CPU forward's output over q's memory viewed as [B, H, S, D] was a
// wrong answer before this check), and two writers of one byte race.
TEST(Validation, WrittenTensorsApartFromEveryOtherTensor) {
  const auto fwd_fails = [](void (*spoil)(Valid&), const char* argument, const char* mentions) {
    Valid v = valid_dense();
    spoil(v);
    expect_fwd_error(v.fwd, ErrorCode::kLayout, argument, mentions);
  };
  fwd_fails([](Valid& v) { v.fwd.out = v.fwd.q; }, "out", "shares memory with q, which the call reads");
  fwd_fails([](Valid& v) { v.fwd.out = TensorView::contiguous(v.c.q.data(), DType::kFloat32, {2, 4, 6, kHeadDim}).transposed(1, 2); },
            "out", "shares memory with q");
  fwd_fails([](Valid& v) { v.fwd.lse.data = static_cast<float*>(v.c.v.data()) + 3; }, "lse", "shares memory with v");
  fwd_fails([](Valid& v) { v.fwd.lse.data = static_cast<float*>(v.c.out.data()) + 5; }, "lse",
            "shares memory with out, which the call also writes");
  {  // lse over the offsets a variable-length call reads
    Valid w = valid_varlen();
    std::vector<float> arena(static_cast<size_t>(w.c.lse.numel()));
    std::memcpy(arena.data(), w.c.cu_q.data(), w.c.cu_q.nbytes());
    w.fwd.options.cu_seqlens_q.data = arena.data();
    w.fwd.lse.data = arena.data();
    expect_fwd_error(w.fwd, ErrorCode::kLayout, "lse", "shares memory with cu_seqlens_q");
  }
  const auto bwd_fails = [](void (*spoil)(Valid&), const char* argument, const char* mentions) {
    Valid v = valid_dense();
    spoil(v);
    expect_bwd_error(v.bwd, ErrorCode::kLayout, argument, mentions);
  };
  bwd_fails([](Valid& v) { v.bwd.dk.data = v.bwd.dq.data; }, "dk", "shares memory with dq, which the call also writes");
  bwd_fails([](Valid& v) { v.bwd.dv.data = v.bwd.dout.data; }, "dv", "shares memory with dout");
  bwd_fails([](Valid& v) { v.bwd.dq = v.bwd.q; }, "dq", "shares memory with q");
  // (Each spoiled view lies inside the other's buffer, so nothing else can meet it.)
  bwd_fails([](Valid& v) { v.bwd.lse.data = static_cast<float*>(v.bwd.dq.data) + 40; }, "dq", "shares memory with lse");
  bwd_fails([](Valid& v) {
              v.bwd.workspace = static_cast<float*>(v.bwd.dv.data) + 9;
              v.bwd.workspace_bytes = 16;
            },
            "workspace", "shares memory with dv");
  Valid v = valid_dense();
  std::vector<unsigned char> workspace(64);
  v.bwd.workspace = workspace.data();
  v.bwd.workspace_bytes = workspace.size();
  EXPECT_NO_THROW(backward(v.bwd));
}

// The views of one packed buffer stay apart byte for byte, so a call takes them, with the results
// of separate tensors: q, k, v and out of one [B, S, 12, D] buffer (4 query heads, 2 KV heads each
// for k and v, 4 for out), and dq, dk and dv of one [B, S, 8, D] buffer.
TEST(Validation, PackedBuffersGiveTheResultsOfSeparateTensors) {
  Valid v = valid_dense();  // q [2, 6, 4, 16], k and v [2, 5, 2, 16]
  constexpr int64_t B = 2, S = 6, W = 12, D = kHeadDim;
  std::mt19937_64 rng = fresh_rng();
  HostTensor buffer(DType::kFloat32, {B, S, W, D});
  buffer.fill(randn(rng, buffer.numel(), 1.0, DType::kFloat32));
  const auto slot = [&](HostTensor& base, int64_t width, int64_t first_head, int64_t rows, int64_t heads) {
    return strided_view(base, first_head * D, {B, rows, heads, D}, {S * width * D, width * D, D, 1});
  };
  ForwardArgs f = v.fwd;
  f.q = slot(buffer, W, 0, 6, 4);
  f.k = slot(buffer, W, 4, 5, 2);
  f.v = slot(buffer, W, 6, 5, 2);
  f.out = slot(buffer, W, 8, 6, 4);
  // The separate tensors hold the packed ones' values (gather_dense reads them in fill's order).
  v.c.q.fill(gather_dense(f.q));
  v.c.k.fill(gather_dense(f.k));
  v.c.v.fill(gather_dense(f.v));
  forward(v.fwd);
  backward(v.bwd);
  HostTensor lse(DType::kFloat32, {B, 4, S});
  f.lse = lse.view();
  forward(f);
  EXPECT_EQ(gather_dense(f.out), gather_dense(v.fwd.out));
  EXPECT_EQ(lse.to_double(), v.c.lse.to_double());

  HostTensor grads(DType::kFloat32, {B, S, 8, D});
  grads.poison();
  BackwardArgs g = v.bwd;
  g.dq = slot(grads, 8, 0, 6, 4);
  g.dk = slot(grads, 8, 4, 5, 2);
  g.dv = slot(grads, 8, 6, 5, 2);
  backward(g);
  EXPECT_EQ(gather_dense(g.dq), gather_dense(v.bwd.dq));
  EXPECT_EQ(gather_dense(g.dk), gather_dense(v.bwd.dk));
  EXPECT_EQ(gather_dense(g.dv), gather_dense(v.bwd.dv));
}

TEST(Validation, ReadTensorsMayBeExpanded) {
  Valid v = valid_dense();
  // Every query row of a head reads the same Q row; the reference sees the same view.
  v.fwd.q.stride[1] = 0;
  EXPECT_NO_THROW(forward(v.fwd));
  Valid b = valid_dense();
  b.bwd.out.stride[1] = 0;
  b.bwd.dout.stride[1] = 0;
  EXPECT_NO_THROW(backward(b.bwd));
}

TEST(Validation, ValueShapeMustEqualKey) {
  Valid v = valid_dense();
  v.fwd.v.shape[1] -= 1;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "v", "must equal k's");
}

TEST(Validation, OutShapeMustEqualQuery) {
  Valid v = valid_dense();
  v.fwd.out.shape[2] -= 1;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "out", "must equal q's");
}

TEST(Validation, HeadDimMustMatch) {
  Valid v = valid_dense();
  v.fwd.k.shape[3] = kHeadDim / 2;
  v.fwd.v.shape[3] = kHeadDim / 2;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "k", "must equal q's");
}

TEST(Validation, BatchMustMatch) {
  Valid v = valid_dense();
  v.fwd.k.shape[0] = 1;
  v.fwd.v.shape[0] = 1;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "k", "must equal q's");
}

TEST(Validation, KvHeadsMustDivideQueryHeads) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(dense(1, 3, 2, 4, 4, kHeadDim), DType::kFloat32, Layout::kBSHD, rng);
  expect_fwd_error(forward_args(c), ErrorCode::kShapeMismatch, "q", "multiple of the KV heads");
}

TEST(Validation, ZeroKvHeadsWithQueryHeads) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(dense(1, 2, 0, 4, 4, kHeadDim), DType::kFloat32, Layout::kBSHD, rng);
  expect_fwd_error(forward_args(c), ErrorCode::kInvalidArgument, "k", "0 heads");
}

// ---- dtypes ------------------------------------------------------------------------------------

TEST(Validation, Fp8IsReserved) {
  for (DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    Valid v = valid_dense();
    for (TensorView* t : {&v.fwd.q, &v.fwd.k, &v.fwd.v, &v.fwd.out}) t->dtype = fp8;
    expect_fwd_error(v.fwd, ErrorCode::kUnsupported, "q", "fp16, bf16 or fp32");
  }
}

TEST(Validation, IntegerInputsAreRejected) {
  Valid v = valid_dense();
  for (TensorView* t : {&v.fwd.q, &v.fwd.k, &v.fwd.v, &v.fwd.out}) t->dtype = DType::kInt32;
  expect_fwd_error(v.fwd, ErrorCode::kDtypeMismatch, "q", "fp16, bf16 or fp32");
}

TEST(Validation, DtypesMustMatchQuery) {
  for (const char* name : {"k", "v", "out"}) {
    Valid v = valid_dense();
    TensorView& t = std::string(name) == "k" ? v.fwd.k : std::string(name) == "v" ? v.fwd.v : v.fwd.out;
    t.dtype = DType::kFloat16;
    expect_fwd_error(v.fwd, ErrorCode::kDtypeMismatch, name, "must match q (fp32)");
  }
}

// ---- devices and backends ---------------------------------------------------------------------

TEST(Validation, DevicesMustMatch) {
  for (const char* name : {"k", "v", "out"}) {
    Valid v = valid_dense();
    TensorView& t = std::string(name) == "k" ? v.fwd.k : std::string(name) == "v" ? v.fwd.v : v.fwd.out;
    t.device = kGpu0;
    expect_fwd_error(v.fwd, ErrorCode::kDeviceMismatch, name, "all tensors must share one device");
  }
}

TEST(Validation, CudaBackendRequestedForHostTensors) {
  Valid v = valid_dense();
  v.fwd.options.backend = Backend::kCUDA;
  expect_fwd_error(v.fwd, ErrorCode::kDeviceMismatch, "backend", "host memory");
}

TEST(Validation, CpuBackendRequestedForDeviceTensors) {
  Valid v = valid_dense();
  for (TensorView* t : {&v.fwd.q, &v.fwd.k, &v.fwd.v, &v.fwd.out, &v.fwd.lse}) t->device = kGpu0;
  v.fwd.options.backend = Backend::kCPU;
  expect_fwd_error(v.fwd, ErrorCode::kDeviceMismatch, "backend", "CUDA device");
}

TEST(Validation, DeviceTensorsWithoutCuda) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA GPU is visible: the GPU suite covers device tensors";
  Valid v = valid_dense();
  for (TensorView* t : {&v.fwd.q, &v.fwd.k, &v.fwd.v, &v.fwd.out, &v.fwd.lse}) t->device = kGpu0;
  expect_fwd_error(v.fwd, ErrorCode::kBackendUnavailable, "backend", "no CUDA backend or no GPU");
}

// ---- options -----------------------------------------------------------------------------------

TEST(Validation, WindowsBelowMinusOne) {
  Valid v = valid_dense();
  v.fwd.options.window_left = -2;
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "window_left", "-1 (unbounded) or >= 0");
  Valid w = valid_dense();
  w.fwd.options.window_right = -5;
  expect_fwd_error(w.fwd, ErrorCode::kInvalidArgument, "window_right", "-1 (unbounded) or >= 0");
}

TEST(Validation, CausalWithPositiveRightWindow) {
  Valid v = valid_dense();
  v.fwd.options.causal = true;
  v.fwd.options.window_right = 3;
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "window_right", "-1 or 0 when causal");
}

TEST(Validation, NonFiniteSoftmaxScale) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Valid v = valid_dense();
    v.fwd.options.softmax_scale = bad;
    expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "softmax_scale", "finite");
  }
}

TEST(Validation, HeadDimOutsideOneTo256) {
  for (int d : {0, 257}) {
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(dense(1, 2, 2, 4, 4, d), DType::kFloat32, Layout::kBSHD, rng);
    expect_fwd_error(forward_args(c), ErrorCode::kUnsupported, "head_dim", "1..256");
  }
}

// ---- lse -----------------------------------------------------------------------------------------

TEST(Validation, LseRank) {
  Valid v = valid_dense();
  v.fwd.lse.rank = 2;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "lse", "[batch, heads, seqlen_q]");
}

TEST(Validation, LseMustBeFp32) {
  Valid v = valid_dense();
  v.fwd.lse.dtype = DType::kFloat16;
  expect_fwd_error(v.fwd, ErrorCode::kDtypeMismatch, "lse", "fp32");
}

TEST(Validation, LseDevice) {
  Valid v = valid_dense();
  v.fwd.lse.device = kGpu0;
  expect_fwd_error(v.fwd, ErrorCode::kDeviceMismatch, "lse", "one device");
}

TEST(Validation, LseShape) {
  Valid v = valid_dense();
  v.fwd.lse.shape[2] += 1;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "lse", "must be [2, 4, 6]");
  Valid w = valid_varlen();
  w.fwd.lse.shape[0] -= 1;
  expect_fwd_error(w.fwd, ErrorCode::kShapeMismatch, "lse", "must be [4, 7]");
}

TEST(Validation, BackwardNeedsLse) {
  Valid v = valid_dense();
  v.bwd.lse = TensorView{};
  expect_bwd_error(v.bwd, ErrorCode::kInvalidArgument, "lse", "required");
}

// ---- varlen ------------------------------------------------------------------------------------

TEST(Validation, VarlenNeedsBothOffsetTensors) {
  Valid v = valid_varlen();
  v.fwd.options.cu_seqlens_k = TensorView{};
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "cu_seqlens_k", "both cu_seqlens_q and cu_seqlens_k");
  Valid w = valid_varlen();
  w.fwd.options.cu_seqlens_q = TensorView{};
  expect_fwd_error(w.fwd, ErrorCode::kInvalidArgument, "cu_seqlens_q", "both cu_seqlens_q and cu_seqlens_k");
}

TEST(Validation, OffsetTensorRankDtypeSizeDataDeviceStride) {
  {
    Valid v = valid_varlen();
    v.fwd.options.cu_seqlens_q.rank = 2;
    expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "cu_seqlens_q", "1-D int32");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.cu_seqlens_k.dtype = DType::kFloat32;
    expect_fwd_error(v.fwd, ErrorCode::kDtypeMismatch, "cu_seqlens_k", "int32");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.cu_seqlens_q.shape[0] = 0;
    v.fwd.options.cu_seqlens_k.shape[0] = 0;
    expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "cu_seqlens_q", "batch + 1");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.cu_seqlens_k.data = nullptr;
    expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "cu_seqlens_k", "null");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.cu_seqlens_q.device = kGpu0;
    expect_fwd_error(v.fwd, ErrorCode::kDeviceMismatch, "cu_seqlens_q", "same device as q");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.cu_seqlens_k.stride[0] = 2;
    expect_fwd_error(v.fwd, ErrorCode::kLayout, "cu_seqlens_k", "contiguous");
  }
}

TEST(Validation, OffsetTensorsMustHaveTheSameLength) {
  Valid v = valid_varlen();
  v.fwd.options.cu_seqlens_k.shape[0] -= 1;
  expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "cu_seqlens_k", "as many entries as cu_seqlens_q");
}

// The CUDA alignment rule that validation enforces and the PyTorch binding copies around: the
// data pointer and the strides of dimensions longer than one, but the last, in 16-byte units.
TEST(Validation, CudaMisalignmentRule) {
  alignas(16) static uint16_t storage[4096];
  TensorView t = TensorView::contiguous(storage, DType::kFloat16, {2, 4, 3, 64});
  EXPECT_EQ(cuda_misalignment(t), kCudaAligned);
  t.data = storage + 1;
  EXPECT_EQ(cuda_misalignment(t), kCudaMisalignedData);
  t.data = storage;
  t.stride[1] = 3 * 64 + 3;  // rows padded by an odd count
  EXPECT_EQ(cuda_misalignment(t), 1);
  t.shape[1] = 1;  // a dimension of one element is never stepped through
  EXPECT_EQ(cuda_misalignment(t), kCudaAligned);
  t.stride[2] = 67;
  EXPECT_EQ(cuda_misalignment(t), 2);
}

// seqused_k is read only by the kernels (they clamp its entries), so only its description is checked.
TEST(Validation, SequsedK) {
  std::vector<int32_t> used = {1, 0, 7};
  const TensorView view = TensorView::contiguous(used.data(), DType::kInt32, {3});
  {
    Valid v = valid_varlen();
    v.fwd.options.seqused_k = view;
    EXPECT_NO_THROW(forward(v.fwd));
    v.bwd.options.seqused_k = view;
    expect_bwd_error(v.bwd, ErrorCode::kUnsupported, "seqused_k", "forward only");
  }
  {
    Valid v = valid_dense();
    v.fwd.options.seqused_k = TensorView::contiguous(used.data(), DType::kInt32, {2});
    expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "seqused_k", "variable-length");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.seqused_k = TensorView::contiguous(used.data(), DType::kInt32, {2});
    expect_fwd_error(v.fwd, ErrorCode::kShapeMismatch, "seqused_k", "3 key counts");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.seqused_k = TensorView::contiguous(used.data(), DType::kFloat32, {3});
    expect_fwd_error(v.fwd, ErrorCode::kDtypeMismatch, "seqused_k", "int32");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.seqused_k = view;
    v.fwd.options.seqused_k.data = nullptr;
    expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "seqused_k", "null");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.seqused_k = view;
    v.fwd.options.seqused_k.device = kGpu0;
    expect_fwd_error(v.fwd, ErrorCode::kDeviceMismatch, "seqused_k", "same device");
  }
  {
    Valid v = valid_varlen();
    v.fwd.options.seqused_k = view;
    v.fwd.options.seqused_k.stride[0] = 2;
    expect_fwd_error(v.fwd, ErrorCode::kLayout, "seqused_k", "contiguous");
  }
}

TEST(Validation, NegativeMaxSeqlen) {
  Valid v = valid_varlen();
  v.fwd.options.max_seqlen_q = -1;
  expect_fwd_error(v.fwd, ErrorCode::kInvalidArgument, "max_seqlen_q", ">= 0");
  Valid w = valid_varlen();
  w.fwd.options.max_seqlen_k = -1;
  expect_fwd_error(w.fwd, ErrorCode::kInvalidArgument, "max_seqlen_k", ">= 0");
}

// Offsets whose content is wrong: the values are read and checked before any kernel runs.
void expect_bad_offsets(const std::vector<double>& cu_q, const std::vector<double>& cu_k, ErrorCode code,
                        const std::string& argument, const std::string& mentions) {
  Valid v = valid_varlen();
  v.c.cu_q.fill(cu_q);
  v.c.cu_k.fill(cu_k);
  expect_fwd_error(v.fwd, code, argument, mentions);
}

TEST(Validation, OffsetContents) {
  // Valid: q {0, 3, 3, 7} (total 7, max 4), k {0, 2, 7, 8} (total 8, max 5).
  expect_bad_offsets({1, 3, 3, 7}, {0, 2, 7, 8}, ErrorCode::kInvalidArgument, "cu_seqlens_q", "must start at 0");
  expect_bad_offsets({0, 3, 3, 7}, {0, 4, 2, 8}, ErrorCode::kInvalidArgument, "cu_seqlens_k", "non-decreasing");
  expect_bad_offsets({0, 1, 1, 7}, {0, 2, 7, 8}, ErrorCode::kInvalidArgument, "max_seqlen_q", "has length 6");
  expect_bad_offsets({0, 3, 3, 7}, {0, 2, 8, 8}, ErrorCode::kInvalidArgument, "max_seqlen_k", "has length 6");
  expect_bad_offsets({0, 3, 3, 7}, {0, 2, 4, 9}, ErrorCode::kShapeMismatch, "cu_seqlens_k", "exceeds the packed tensor's 8 rows");
}

// check_cu_seqlens: the same check on its own, returning the last offset; with that result in
// Options::checked_rows_q/k a call skips its own read of the offsets (it trusts them) but still
// checks what needs no read.
TEST(Validation, OffsetsCheckedOnceByTheCaller) {
  Valid v = valid_varlen();  // q {0, 3, 3, 7}, k {0, 2, 7, 8}
  const Options& o = v.fwd.options;
  EXPECT_EQ(check_cu_seqlens(o.cu_seqlens_q, false, o.max_seqlen_q, v.fwd.q.shape[0]), 7);
  EXPECT_EQ(check_cu_seqlens(o.cu_seqlens_k, true, o.max_seqlen_k, v.fwd.k.shape[0]), 8);
  expect_error([&] { check_cu_seqlens(o.cu_seqlens_q, false, 3, v.fwd.q.shape[0]); }, ErrorCode::kInvalidArgument,
               "max_seqlen_q", "has length 4");
  expect_error([&] { check_cu_seqlens(o.cu_seqlens_k, true, o.max_seqlen_k, 7); }, ErrorCode::kShapeMismatch,
               "cu_seqlens_k", "exceeds the packed tensor's 7 rows");
  expect_error([&] { check_cu_seqlens(o.cu_seqlens_k, true, -1, 8); }, ErrorCode::kInvalidArgument, "max_seqlen_k",
               ">= 0");

  // Checked rows given: the same results as the call that checks for itself.
  ForwardArgs checked = v.fwd;
  checked.options.checked_rows_q = 7;
  checked.options.checked_rows_k = 8;
  forward(v.fwd);
  const std::vector<double> out = v.c.out.to_double(), lse = v.c.lse.to_double();
  v.c.out.poison();
  v.c.lse.poison();
  forward(checked);
  EXPECT_EQ(v.c.out.to_double(), out);
  EXPECT_EQ(v.c.lse.to_double(), lse);
  // Host offsets are read even so (it costs no copy): checked rows that are not theirs fail, ...
  checked.options.checked_rows_k = 9;
  expect_fwd_error(checked, ErrorCode::kInvalidArgument, "checked_rows_k", "ends at 8");
  // ... and so do offsets that changed since their check. (On CUDA tensors, where the check
  // costs a copy and a sync, checked rows are trusted and only held to the packed rows; the
  // Python binding's varlen calls pass them.)
  checked.options.checked_rows_k = 8;
  v.c.cu_q.fill({1, 3, 3, 7});
  expect_fwd_error(checked, ErrorCode::kInvalidArgument, "cu_seqlens_q", "start at 0");
  v.c.cu_q.fill({0, 3, 4, 8});
  expect_fwd_error(checked, ErrorCode::kShapeMismatch, "cu_seqlens_q", "exceeds");
}

// ---- backward gradients ---------------------------------------------------------------------------

TEST(Validation, GradientTensors) {
  {
    Valid v = valid_dense();
    v.bwd.dout.rank = 3;
    expect_bwd_error(v.bwd, ErrorCode::kShapeMismatch, "dout", "[batch, seqlen, heads, head_dim]");
  }
  {
    Valid v = valid_dense();
    v.bwd.dq.shape[1] += 1;
    expect_bwd_error(v.bwd, ErrorCode::kShapeMismatch, "dq", "must equal q's");
  }
  {
    Valid v = valid_dense();
    v.bwd.dk.shape[2] = 1;
    expect_bwd_error(v.bwd, ErrorCode::kShapeMismatch, "dk", "must equal k's");
  }
  {
    Valid v = valid_dense();
    v.bwd.dk.dtype = DType::kBFloat16;
    expect_bwd_error(v.bwd, ErrorCode::kDtypeMismatch, "dk", "must match q (fp32)");
  }
  {
    Valid v = valid_dense();
    v.bwd.dv.device = kGpu0;
    expect_bwd_error(v.bwd, ErrorCode::kDeviceMismatch, "dv", "one device");
  }
  {
    Valid v = valid_dense();
    v.bwd.dq.stride[3] = 3;
    expect_bwd_error(v.bwd, ErrorCode::kLayout, "dq", "stride 1");
  }
  {
    Valid v = valid_dense();
    v.bwd.dv.data = nullptr;
    expect_bwd_error(v.bwd, ErrorCode::kInvalidArgument, "dv", "null");
  }
}

TEST(Validation, BackwardRunsTheForwardChecksToo) {
  Valid v = valid_dense();
  v.bwd.options.window_left = -3;
  expect_bwd_error(v.bwd, ErrorCode::kInvalidArgument, "window_left", ">= 0");
  Valid w = valid_dense();
  w.bwd.out.dtype = DType::kFloat16;
  expect_bwd_error(w.bwd, ErrorCode::kDtypeMismatch, "out", "must match q");
}

TEST(Validation, TensorViewRankAboveFour) {
  expect_error([] { TensorView::contiguous(nullptr, DType::kFloat32, {1, 1, 1, 1, 1}); }, ErrorCode::kInvalidArgument,
               "shape", "at most 4");
}

TEST(Validation, ErrorMessageStartsWithTheArgument) {
  Valid v = valid_dense();
  v.fwd.options.window_left = -2;
  const std::optional<Error> e = error_of([&] { forward(v.fwd); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(std::string(e->what()).rfind("window_left: ", 0), 0u) << e->what();
}

}  // namespace
}  // namespace fusedattn::testing
