// Torch-free tensor views: a data pointer, a dtype, a shape and strides in elements.
// Only the last dimension must be contiguous, so both the (batch, seqlen, heads, dim) layout of
// flash_attn and the (batch, heads, seqlen, dim) layout of the Triton tutorial are views of the
// same memory with permuted strides; nothing is ever copied to change layout. Strides are >= 0;
// a tensor the call reads may repeat elements (stride 0, an expanded view), one it writes may not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace fusedattn {

enum class DType : int8_t {
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat8E4M3,  // reserved: no kernel accepts fp8 yet
  kFloat8E5M2,  // reserved
  kInt32,       // index tensors only (cu_seqlens)
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

enum class DeviceType : int8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; ignored for the CPU
  bool operator==(const Device& o) const { return type == o.type && (type == DeviceType::kCPU || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

constexpr int kMaxRank = 4;

// The CUDA backend loads 16-byte vectors: a tensor it reads or writes needs a data pointer, and a
// stride for every dimension longer than one but the last (whose stride is 1), in multiples of
// this many bytes.
constexpr int kCudaAlignBytes = 16;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t stride[kMaxRank] = {};  // in elements, not bytes
  Device device{};

  int64_t size(int d) const { return shape[d]; }
  int64_t numel() const;
  bool empty() const { return rank == 0 && data == nullptr; }  // "not given"

  // A dense row-major view of `shape`.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = {});
  // The same memory with dimensions a and b swapped (BSHD <-> BHSD).
  TensorView transposed(int a, int b) const;
};

// Where the CUDA backend's 16-byte loads cannot follow a view: kCudaAligned nowhere,
// kCudaMisalignedData its data pointer, else the first dimension d longer than one element (not
// the last) whose stride is not a multiple of kCudaAlignBytes. Validation rejects such a view;
// the PyTorch binding copies it instead.
constexpr int kCudaAligned = -1;
constexpr int kCudaMisalignedData = -2;
int cuda_misalignment(const TensorView& t);

}  // namespace fusedattn
