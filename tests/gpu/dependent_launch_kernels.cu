#include "gpu/dependent_launch_kernels.h"

namespace fusedattn::testing {
namespace {

constexpr int kMaxCopies = 4;
constexpr int kCopyThreads = 256;
constexpr unsigned kSleepNs = 1000;  // between reads of the clock while the copy waits

struct Copies {
  DeviceCopy copy[kMaxCopies];
  int count;
};

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void late_copies(const __grid_constant__ Copies copies, uint64_t delay_ns) {
  cudaTriggerProgrammaticLaunchCompletion();  // the next dependent launch may start now
  const uint64_t start = global_ns();
  while (global_ns() - start < delay_ns) __nanosleep(kSleepNs);
  for (int c = 0; c < copies.count; ++c) {
    const DeviceCopy& d = copies.copy[c];
    const auto* src = static_cast<const uint4*>(d.src);
    auto* dst = static_cast<uint4*>(d.dst);
    for (std::size_t i = threadIdx.x; i < d.bytes / sizeof(uint4); i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void early_peek(const uint32_t* src, uint32_t* seen) {
  *seen = *static_cast<const volatile uint32_t*>(src);
}

}  // namespace

cudaError_t launch_late_copies(const DeviceCopy* copies, int count, uint64_t delay_ns, cudaStream_t stream) {
  if (count < 0 || count > kMaxCopies) return cudaErrorInvalidValue;
  Copies all{};
  for (int c = 0; c < count; ++c) all.copy[c] = copies[c];
  all.count = count;
  late_copies<<<1, kCopyThreads, 0, stream>>>(all, delay_ns);
  return cudaGetLastError();
}

cudaError_t launch_early_peek(const uint32_t* src, uint32_t* seen, cudaStream_t stream) {
  return launch_peek_as_dependent(early_peek, src, seen, stream);
}

cudaError_t launch_peek_as_dependent(PeekKernel kernel, const uint32_t* src, uint32_t* seen, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &dependent;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, src, seen);
}

}  // namespace fusedattn::testing
