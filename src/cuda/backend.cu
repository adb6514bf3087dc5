// Host side of the CUDA backend: device queries, the device guard, workspace, dispatch.
#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include "api/zero_runs.h"
#include "cuda/common/check.cuh"
#include "cuda/common/device.h"
#include "cuda/dispatch.h"
#include "cuda/offsets_check.h"
#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda {
namespace {

void compute_capability(int index, int& major, int& minor) {
  major = device_attribute(cudaDevAttrComputeCapabilityMajor, index);
  minor = device_attribute(cudaDevAttrComputeCapabilityMinor, index);
}

}  // namespace

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string device_name(int index) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "unknown CUDA device";
  return prop.name;
}

bool supports_head_dim(int head_dim) { return has_head_dim(head_dim); }

std::string supported_head_dims() {
  return "multiples of 8 up to the largest compiled instance (compiled: " + compiled_head_dims() + ")";
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, int index, void* stream) {
  DeviceGuard guard(index);
  auto s = static_cast<cudaStream_t>(stream);
  FUSEDATTN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  FUSEDATTN_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_rows_to_host(void* dst, const void* src, std::size_t row_bytes, std::size_t rows, std::size_t src_pitch,
                       int index, void* stream) {
  DeviceGuard guard(index);
  auto s = static_cast<cudaStream_t>(stream);
  FUSEDATTN_CUDA_CHECK(cudaMemcpy2DAsync(dst, row_bytes, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToHost, s));
  FUSEDATTN_CUDA_CHECK(cudaStreamSynchronize(s));
}

void zero_fill(const TensorView& t, void* stream) {
  DeviceGuard guard(t.device.index);
  auto s = static_cast<cudaStream_t>(stream);
  const detail::ZeroRuns runs = detail::zero_runs(t);
  char* const base = static_cast<char*>(t.data);
  runs.for_each_block([&](int64_t offset) {
    FUSEDATTN_CUDA_CHECK(cudaMemset2DAsync(base + offset, static_cast<std::size_t>(runs.pitch), 0,
                                           static_cast<std::size_t>(runs.width), static_cast<std::size_t>(runs.height), s));
  });
}

bool stream_capturing(int index, void* stream) {
  DeviceGuard guard(index);
  return capturing(static_cast<cudaStream_t>(stream));
}

bool take_offsets_fault(int index, OffsetsFault& fault) {
  DeviceGuard guard(index);
  FUSEDATTN_CUDA_CHECK(cudaDeviceSynchronize());
  return take_offsets_fault(fault);
}

void forward(const FwdParams& params) {
  DeviceGuard guard(params.device.index);
  int major = 0, minor = 0;
  compute_capability(params.device.index, major, minor);
  choose_forward(params, major, minor).fn(params);
  FUSEDATTN_CHECK_LAUNCH();
  if (params.offsets_on_device) check_offsets_on_device(params);
}

std::size_t backward_workspace_bytes(const BwdParams& params) { return sm80::bwd_workspace_bytes(params); }

void backward(const BwdParams& params) {
  DeviceGuard guard(params.device.index);
  int major = 0, minor = 0;
  compute_capability(params.device.index, major, minor);
  const BwdFn fn = choose_backward(params, major, minor).fn;
  BwdParams p = params;
  const std::size_t need = sm80::bwd_workspace_bytes(p);
  auto stream = static_cast<cudaStream_t>(p.stream);
  void* owned = nullptr;
  if (p.workspace == nullptr) {
    // Stream-ordered allocation: freed after the kernels that use it, without a device sync.
    FUSEDATTN_CUDA_CHECK(cudaMallocAsync(&owned, need, stream));
    p.workspace = owned;
    p.workspace_bytes = need;
  } else if (p.workspace_bytes < need) {
    throw Error(ErrorCode::kInvalidArgument, "workspace",
                "needs " + std::to_string(need) + " bytes (backward_workspace_bytes), got " +
                    std::to_string(p.workspace_bytes));
  }
  try {
    fn(p);
    FUSEDATTN_CHECK_LAUNCH();
    if (p.offsets_on_device) check_offsets_on_device(p);
  } catch (...) {
    if (owned) cudaFreeAsync(owned, stream);
    throw;
  }
  if (owned) FUSEDATTN_CUDA_CHECK(cudaFreeAsync(owned, stream));
}

}  // namespace fusedattn::cuda
