// Error paths specific to the CUDA backend: each asserts the fusedattn::Error's code, the
// argument it names and that the message says what is accepted.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>

#include "gpu/gpu_check.h"

namespace fusedattn::testing {
namespace {

constexpr int kHeadDim = 64;

// A valid case on the device, to break one thing at a time. Held by pointer: the DeviceCase
// refers to the HostCase, which must not move.
struct ValidGpu {
  std::unique_ptr<HostCase> c;
  std::unique_ptr<DeviceCase> dc;
};

ValidGpu valid_gpu(const Problem& p = dense(2, 4, 2, 40, 50, kHeadDim), DType dtype = DType::kFloat16) {
  std::mt19937_64 rng = fresh_rng();
  ValidGpu v;
  v.c = std::make_unique<HostCase>(make_case(p, dtype, Layout::kBSHD, rng));
  v.dc = std::make_unique<DeviceCase>(*v.c);
  return v;
}

TEST(GpuErrors, Fp32IsRejected) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu(dense(1, 2, 2, 16, 16, kHeadDim), DType::kFloat32);
  expect_error([&] { forward(v.dc->forward_args()); }, ErrorCode::kUnsupported, "q", "fp16 and bf16");
  expect_error([&] { backward(v.dc->backward_args()); }, ErrorCode::kUnsupported, "q", "fp16 and bf16");
}

TEST(GpuErrors, MisalignedPointer) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu();
  ForwardArgs a = v.dc->forward_args();
  // One element past a 16-byte boundary; the shape shrinks by one row so the view stays inside.
  a.k.data = static_cast<char*>(a.k.data) + dtype_size(a.k.dtype);
  a.k.shape[1] -= 1;
  a.v.shape[1] -= 1;
  expect_error([&] { forward(a); }, ErrorCode::kLayout, "k", "16-byte aligned");
  BackwardArgs b = v.dc->backward_args();
  b.dq.data = static_cast<char*>(b.dq.data) + dtype_size(b.dq.dtype);
  b.dq.shape[1] -= 1;
  b.q.shape[1] -= 1;
  b.out.shape[1] -= 1;
  b.dout.shape[1] -= 1;
  b.lse.shape[2] -= 1;
  expect_error([&] { backward(b); }, ErrorCode::kLayout, "dq", "16-byte aligned");
}

TEST(GpuErrors, StrideNotAMultipleOf8Elements) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu();
  ForwardArgs a = v.dc->forward_args();
  // Fewer heads over the same rows: the row stride (Hq * D) stays, the head stride becomes odd,
  // which only ever points inside the original allocation.
  a.q.shape[2] = 1;
  a.out.shape[2] = 1;
  a.k.shape[2] = 1;
  a.v.shape[2] = 1;
  a.lse = TensorView{};
  a.q.stride[1] -= 4;  // 4 fp16 elements = 8 bytes: not a multiple of 16 bytes
  expect_error([&] { forward(a); }, ErrorCode::kLayout, "q", "multiple of 8 elements");
}

// Batch and heads ride on grid dimensions of at most 65535. The oversized batch aliases one
// small allocation (batch stride 0): validation rejects it before any memory is touched.
TEST(GpuErrors, BatchAboveTheGridLimit) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu(dense(1, 2, 2, 16, 16, kHeadDim));
  ForwardArgs a = v.dc->forward_args();
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) {
    t->shape[0] = 65536;
    t->stride[0] = 0;
  }
  a.lse.shape[0] = 65536;
  a.lse.stride[0] = 0;
  expect_error([&] { forward(a); }, ErrorCode::kUnsupported, "q", "at most 65535");
}

TEST(GpuErrors, CpuAndGpuTensorsMixed) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu();
  ForwardArgs a = v.dc->forward_args();
  a.k = v.c->k.view();  // host memory
  expect_error([&] { forward(a); }, ErrorCode::kDeviceMismatch, "k", "all tensors must share one device");
  ForwardArgs b = v.dc->forward_args();
  b.lse = v.c->lse.view();
  expect_error([&] { forward(b); }, ErrorCode::kDeviceMismatch, "lse", "one device");
  BackwardArgs c = v.dc->backward_args();
  c.dv = v.c->dv.view();
  expect_error([&] { backward(c); }, ErrorCode::kDeviceMismatch, "dv", "one device");
}

TEST(GpuErrors, CpuBackendRequestedForDeviceTensors) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu();
  ForwardArgs a = v.dc->forward_args();
  a.options.backend = Backend::kCPU;
  expect_error([&] { forward(a); }, ErrorCode::kDeviceMismatch, "backend", "CUDA device");
}

TEST(GpuErrors, HeadDimNotAMultipleOf8) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu(dense(1, 2, 2, 16, 16, 36));
  expect_error([&] { forward(v.dc->forward_args()); }, ErrorCode::kUnsupported, "head_dim", "multiples of 8");
}

TEST(GpuErrors, OffsetsOnTheHostWithDeviceTensors) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu(packed(2, 2, kHeadDim, {5, 9}, {7, 3}));
  ForwardArgs a = v.dc->forward_args();
  a.options.cu_seqlens_q = v.c->cu_q.view();
  expect_error([&] { forward(a); }, ErrorCode::kDeviceMismatch, "cu_seqlens_q", "same device as q");
}

TEST(GpuErrors, DeviceOffsetsAreReadAndChecked) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu(packed(2, 2, kHeadDim, {5, 9}, {7, 3}));
  v.c->cu_k.fill({0, 2, 1});  // decreasing
  v.dc->cu_k.upload(v.c->cu_k);
  expect_error([&] { forward(v.dc->forward_args()); }, ErrorCode::kInvalidArgument, "cu_seqlens_k", "non-decreasing");
}

TEST(GpuErrors, WorkspaceTooSmall) {
  FUSEDATTN_REQUIRE_GPU();
  ValidGpu v = valid_gpu();
  FUSEDATTN_RUN_OR_SKIP(v.dc->forward());
  BackwardArgs a = v.dc->backward_args();
  const std::size_t need = backward_workspace_bytes(a);
  if (need == 0) GTEST_SKIP() << "this backward needs no workspace";
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, need), cudaSuccess);
  a.workspace = workspace;
  a.workspace_bytes = need - 1;
  expect_error([&] { backward(a); }, ErrorCode::kInvalidArgument, "workspace", "backward_workspace_bytes");
  cudaFree(workspace);
}

}  // namespace
}  // namespace fusedattn::testing
