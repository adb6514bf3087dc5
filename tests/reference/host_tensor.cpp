// HostTensor: bytes in a storage dtype, in BSHD or BHSD memory order, exposed as TensorViews.
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "reference/reference.h"

namespace fusedattn::testing {
namespace {

constexpr int kDenseRank = 4;  // [B, S, H, D]

bool permuted(Layout layout, size_t rank) { return layout == Layout::kBHSD && rank == kDenseRank; }

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape, Layout layout)
    : dtype_(dtype), shape_(std::move(shape)), layout_(layout) {
  if (shape_.empty() || shape_.size() > static_cast<size_t>(kMaxRank))
    throw std::invalid_argument("HostTensor: rank must be 1..4");
  for (int64_t s : shape_)
    if (s < 0) throw std::invalid_argument("HostTensor: negative size");
  bytes_.resize(static_cast<size_t>(numel()) * dtype_size(dtype_));
}

int64_t HostTensor::numel() const {
  return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<int64_t>());
}

TensorView HostTensor::view() { return view_at(bytes_.data(), Device{}); }

TensorView HostTensor::view_at(void* data, Device device) const {
  TensorView t;
  t.data = data;
  t.dtype = dtype_;
  t.device = device;
  t.rank = static_cast<int>(shape_.size());
  // Strides of the memory order, then mapped back to the canonical dimension order.
  std::vector<int64_t> mem_shape = shape_;
  if (permuted(layout_, shape_.size())) std::swap(mem_shape[1], mem_shape[2]);
  std::vector<int64_t> mem_stride(shape_.size());
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    mem_stride[d] = stride;
    stride *= mem_shape[d];
  }
  if (permuted(layout_, shape_.size())) std::swap(mem_stride[1], mem_stride[2]);
  for (int d = 0; d < t.rank; ++d) {
    t.shape[d] = shape_[d];
    t.stride[d] = mem_stride[d];
  }
  return t;
}

namespace {

// Calls fn(canonical index, memory index) for every element, in canonical order.
template <typename Fn>
void for_each_position(const std::vector<int64_t>& shape, Layout layout, int64_t numel, Fn fn) {
  if (!permuted(layout, shape.size())) {
    for (int64_t n = 0; n < numel; ++n) fn(n, n);
    return;
  }
  const int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  int64_t c = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) fn(c++, ((b * H + h) * S + s) * D + d);
}

}  // namespace

void HostTensor::fill(const std::vector<double>& canonical) {
  if (static_cast<int64_t>(canonical.size()) != numel())
    throw std::invalid_argument("HostTensor::fill: " + std::to_string(canonical.size()) + " values for " +
                                std::to_string(numel()) + " elements");
  const size_t elem = dtype_size(dtype_);
  for_each_position(shape_, layout_, numel(), [&](int64_t c, int64_t m) {
    encode(dtype_, &canonical[c], bytes_.data() + m * elem, 1);
  });
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> canonical(static_cast<size_t>(numel()));
  const size_t elem = dtype_size(dtype_);
  for_each_position(shape_, layout_, numel(), [&](int64_t c, int64_t m) {
    decode(dtype_, bytes_.data() + m * elem, &canonical[c], 1);
  });
  return canonical;
}

void HostTensor::poison() {
  if (dtype_ == DType::kInt32) {  // no NaN in an integer type: all bits set (-1) is as implausible
    std::memset(bytes_.data(), 0xff, bytes_.size());
    return;
  }
  const std::vector<double> nan(static_cast<size_t>(numel()), std::numeric_limits<double>::quiet_NaN());
  encode(dtype_, nan.data(), bytes_.data(), numel());
}

}  // namespace fusedattn::testing
