// The bridge between torch and fusedattn's torch-free API: tensors become TensorViews without a
// copy (the API accepts any strides whose last dimension is contiguous; CUDA views the kernels
// cannot load from are copied first, readable_by_kernels), the caller's current
// stream is found through torch's device-generic guard interface (so this file needs no CUDA
// headers and builds against a CPU-only torch too), and fusedattn::Error becomes the Python
// exception that matches its code.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "fusedattn/attention.h"

namespace fusedattn::torch_binding {

// A view of `t`'s memory; `name` is the argument name used in error messages.
TensorView to_view(const at::Tensor& t, const char* name);

// `t` itself, or a contiguous copy when `t` is a CUDA view whose data pointer or strides the
// kernels' 16-byte loads cannot follow (a slice at an odd element offset, a packed buffer with an
// odd row length). Views that are wrong rather than misaligned (last dimension not contiguous)
// are passed through for validation to name.
// `name` as for to_view (its checks of rank and dtype name the argument).
at::Tensor readable_by_kernels(const at::Tensor& t, const char* name);

// Raises ValueError naming `name` unless `t` has `rank` dimensions. The binding needs this before
// validation only because it sizes the outputs it allocates from the inputs' shapes.
void expect_rank(const at::Tensor& t, const char* name, int64_t rank, const char* layout);

// The current stream of `device` as a cudaStream_t (null for the CPU).
void* current_stream(const c10::Device& device);

// Options shared by every op: scale, mask, and the current stream of `device`.
Options make_options(const c10::Device& device, std::optional<double> softmax_scale, bool causal,
                     int64_t window_left, int64_t window_right);

[[noreturn]] void rethrow_as_torch_error(const Error& e);

// Runs `body`, turning fusedattn::Error into ValueError / NotImplementedError / RuntimeError.
template <typename Body>
decltype(auto) translate_errors(Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    rethrow_as_torch_error(e);
  }
}

}  // namespace fusedattn::torch_binding
