// Asynchronous global -> shared copies (Ampere cp.async), the loads of every sm80 kernel.
//
// Contract: each cp_async_16 moves one 16-byte chunk; both addresses must be 16-byte aligned.
// Copies issued since the last cp_async_commit() form one group; cp_async_wait<N>() blocks the
// calling thread until at most N of its groups are still in flight. Completion is per thread:
// a __syncthreads() is still needed before other threads read the data.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::ptx {

// Bytes per cp.async.cg: the .cg (L2-only) variant supports only 16-byte copies.
constexpr int kCpAsyncBytes = 16;

// cp.async.cg.shared.global [smem], [gmem], 16, src_size;   (PTX ISA 7.0, sm_80+)
// With pred == false, src_size is 0: no global bytes are read and the 16 destination bytes are
// zero-filled. That gives out-of-range rows/columns zeros without a branch around the copy;
// callers still pass an in-bounds gmem (e.g. the tensor base) so no wild address is ever formed.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool pred) {
  const int src_size = pred ? kCpAsyncBytes : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_size)
               : "memory");
}

// cp.async.commit_group;   (PTX ISA 7.0, sm_80+)
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// cp.async.wait_group N;   (PTX ISA 7.0, sm_80+)  N must be a compile-time constant.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace fusedattn::cuda::ptx
