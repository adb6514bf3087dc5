// Kernels the dependent-launch test runs before the forward on its stream
// (test_dependent_launch.cpp): a kernel whose writes land late but which lets a dependent launch
// start at once, and a dependent launch that reads without waiting, which shows whether a kernel
// launched so can start early on this device at all.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fusedattn::testing {

struct DeviceCopy {
  void* dst;
  const void* src;
  std::size_t bytes;  // a multiple of 16; both addresses 16-byte aligned
};

// One CTA that first lets the next dependent launch on `stream` start, then waits `delay_ns` and
// then does `count` copies, in order.
cudaError_t launch_late_copies(const DeviceCopy* copies, int count, uint64_t delay_ns, cudaStream_t stream);

// A dependent launch (programmatic stream serialisation) of one thread that copies the word at
// `src` to `seen` without waiting for the kernel before it.
cudaError_t launch_early_peek(const uint32_t* src, uint32_t* seen, cudaStream_t stream);

// The same launch of another such kernel (tools/pdl_probe.cu brings kernels of its own, in other
// states of loading).
using PeekKernel = void (*)(const uint32_t* src, uint32_t* seen);
cudaError_t launch_peek_as_dependent(PeekKernel kernel, const uint32_t* src, uint32_t* seen, cudaStream_t stream);

}  // namespace fusedattn::testing
