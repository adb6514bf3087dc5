#include "torch_views.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <string>

namespace fusedattn::torch_binding {
namespace {

// Messages that carry numbers are assembled with std::to_string and handed to torch as one C
// string. Streaming integers through c10::str crashed a g++ 13 build of this module on the H200
// machine (cuda-gdb: SIGSEGV inside a copy of ostream::_M_insert<long> linked into the module),
// while messages made only of strings, as rethrow_as_torch_error sends, always worked.
[[noreturn]] void value_error(const std::string& message) { TORCH_CHECK_VALUE(false, message.c_str()); }

DType to_dtype(at::ScalarType type, const char* name) {
  switch (type) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat32;
    case at::kInt: return DType::kInt32;
    default:
      TORCH_CHECK_VALUE(false, "fusedattn: ", name, ": dtype ", type,
                        " is not supported; use float16, bfloat16 or float32 (int32 for cu_seqlens, seqused_k, block_table and column_mask)");
  }
}

Device to_device(const c10::Device& device, const char* name) {
  if (device.is_cpu()) return {DeviceType::kCPU, 0};
  if (device.is_cuda()) return {DeviceType::kCUDA, device.index()};
  TORCH_CHECK_VALUE(false, "fusedattn: ", name, ": tensors on ", device,
                    " are not supported; use CPU or CUDA tensors");
}

}  // namespace

TensorView to_view(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), "fusedattn: ", name, ": expected a tensor, got None");
  if (t.dim() > kMaxRank)
    value_error(std::string("fusedattn: ") + name + ": rank " + std::to_string(t.dim()) + " exceeds the maximum " +
                std::to_string(kMaxRank));
  TensorView view;
  view.data = t.data_ptr();
  view.dtype = to_dtype(t.scalar_type(), name);
  view.device = to_device(t.device(), name);
  view.rank = static_cast<int>(t.dim());
  for (int d = 0; d < view.rank; ++d) {
    view.shape[d] = t.size(d);
    view.stride[d] = t.stride(d);
  }
  return view;
}

at::Tensor readable_by_kernels(const at::Tensor& t, const char* name) {
  if (!t.defined() || !t.is_cuda() || t.dim() == 0 || t.stride(-1) != 1) return t;
  // clone, not contiguous(): a contiguous tensor at an odd offset would come back unchanged.
  return cuda_misalignment(to_view(t, name)) == kCudaAligned ? t : t.clone(at::MemoryFormat::Contiguous);
}

void expect_rank(const at::Tensor& t, const char* name, int64_t rank, const char* layout) {
  if (t.dim() == rank) return;
  std::string shape = "[";
  for (int64_t d = 0; d < t.dim(); ++d) shape += (d ? ", " : "") + std::to_string(t.size(d));
  value_error(std::string("fusedattn: ") + name + ": expected rank " + std::to_string(rank) + " " + layout +
              ", got rank " + std::to_string(t.dim()) + " with shape " + shape + "]");
}

void* current_stream(const c10::Device& device) {
  if (!device.is_cuda()) return nullptr;
  // The stream torch's caller is on (torch.cuda.current_stream()), as a cudaStream_t: kernels
  // must be ordered with the surrounding torch work and with the caching allocator's reuse.
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
  return impl->getStream(device).native_handle();
}

Options make_options(const c10::Device& device, std::optional<double> softmax_scale, bool causal,
                     int64_t window_left, int64_t window_right) {
  Options options;
  if (softmax_scale) options.softmax_scale = static_cast<float>(*softmax_scale);
  options.causal = causal;
  options.window_left = window_left;
  options.window_right = window_right;
  options.stream = current_stream(device);
  return options;
}

void rethrow_as_torch_error(const Error& e) {
  switch (e.code()) {
    case ErrorCode::kUnsupported: TORCH_CHECK_NOT_IMPLEMENTED(false, "fusedattn: ", e.what());
    case ErrorCode::kBackendUnavailable:
    case ErrorCode::kRuntime: TORCH_CHECK(false, "fusedattn: ", e.what());
    default: TORCH_CHECK_VALUE(false, "fusedattn: ", e.what());
  }
}

}  // namespace fusedattn::torch_binding
