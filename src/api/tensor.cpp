#include "fusedattn/tensor.h"

#include <cstdint>
#include <utility>

#include "fusedattn/attention.h"
#include "fusedattn/error.h"

namespace fusedattn {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kFloat8E4M3: return "fp8_e4m3";
    case DType::kFloat8E5M2: return "fp8_e5m2";
    case DType::kInt32: return "int32";
  }
  return "?";
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kDtypeMismatch: return "dtype_mismatch";
    case ErrorCode::kShapeMismatch: return "shape_mismatch";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kLayout: return "layout";
    case ErrorCode::kDeviceMismatch: return "device_mismatch";
    case ErrorCode::kBackendUnavailable: return "backend_unavailable";
    case ErrorCode::kRuntime: return "runtime";
  }
  return "?";
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kCPU: return "cpu";
    case Backend::kCUDA: return "cuda";
  }
  return "?";
}

int cuda_misalignment(const TensorView& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % kCudaAlignBytes != 0) return kCudaMisalignedData;
  const int64_t vector_elems = kCudaAlignBytes / static_cast<int64_t>(dtype_size(t.dtype));
  for (int d = 0; d + 1 < t.rank; ++d)
    if (t.shape[d] > 1 && t.stride[d] % vector_elems != 0) return d;
  return kCudaAligned;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  if (t.rank > kMaxRank) throw Error(ErrorCode::kInvalidArgument, "shape", "rank must be at most 4");
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  int64_t stride = 1;
  for (d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

TensorView TensorView::transposed(int a, int b) const {
  TensorView t = *this;
  std::swap(t.shape[a], t.shape[b]);
  std::swap(t.stride[a], t.stride[b]);
  return t;
}

}  // namespace fusedattn
