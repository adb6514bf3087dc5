// append_kv on the CUDA backend (kv_cache.h): one block per sequence. Its threads check the pages
// its new tokens land in together, then copy the rows; thread 0 writes the status. Reads nothing
// on the host, so a decode step that appends can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"
#include "cuda/cuda_backend.h"
#include "fusedattn/kv_cache.h"

namespace fusedattn::cuda {
namespace {

// Threads of a sequence's block: its rows are a few KiB, copied an element per thread and step.
constexpr int kAppendThreads = 128;

// Element is a type of the element's size (the copy moves bits, whatever the dtype).
template <typename Element>
__global__ void __launch_bounds__(kAppendThreads) append_kv_kernel(const __grid_constant__ AppendParams p) {
  const int b = blockIdx.x;
  const auto status = [&](AppendStatus s) {
    if (threadIdx.x == 0) p.status[b] = static_cast<int32_t>(s);
  };
  if (!append_fits(p, b)) return status(AppendStatus::kPastCache);
  const int64_t first = p.cache_seqlens[b];
  bool paged_ok = true;
  for (int t = threadIdx.x; t < p.new_tokens; t += kAppendThreads) paged_ok &= append_row(p, b, first + t).page >= 0;
  if (!__syncthreads_and(paged_ok)) return status(AppendStatus::kPageOutside);
  const int64_t per_token = int64_t{p.heads} * p.head_dim;
  for (int64_t i = threadIdx.x; i < p.new_tokens * per_token; i += kAppendThreads) {
    const int t = static_cast<int>(i / per_token);
    const int h = static_cast<int>(i % per_token / p.head_dim), d = static_cast<int>(i % p.head_dim);
    const AppendRow at = append_row(p, b, first + t);
    const auto copy = [&](void* cache, const OperandStrides& cs, const void* src, const OperandStrides& ss) {
      static_cast<Element*>(cache)[at.page * cs.batch + at.row * cs.row + h * cs.head + d] =
          static_cast<const Element*>(src)[int64_t{b} * ss.batch + int64_t{t} * ss.row + h * ss.head + d];
    };
    copy(p.k_cache, p.k_cache_stride, p.k, p.k_stride);
    copy(p.v_cache, p.v_cache_stride, p.v, p.v_stride);
  }
  status(AppendStatus::kAppended);
}

}  // namespace

void append_kv(const AppendParams& p) {
  DeviceGuard guard(p.device_index);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (dtype_size(p.dtype) == sizeof(float))
    append_kv_kernel<float><<<p.batch, kAppendThreads, 0, stream>>>(p);
  else
    append_kv_kernel<unsigned short><<<p.batch, kAppendThreads, 0, stream>>>(p);
  FUSEDATTN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusedattn::cuda
