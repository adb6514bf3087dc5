// Whether this device starts a dependent launch (programmatic stream serialisation) before the
// kernel ahead of it on the stream has ended, and what stops it. The dependent-launch test's
// kernels (tests/gpu/dependent_launch_kernels.cu): one CTA lets dependents start at once and
// replaces a word 2 ms later; a dependent peek right behind it reads the word without waiting.
// Early: it read the old word.
//
// A module loaded lazily (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) is loaded at its
// kernel's first launch, so each way starts from a peek in another state:
//   first launch  the test's peek, launched for the first time
//   warmed        the same peek again, once it has run
//   attributes    a peek of this file's, never launched but loaded by cudaFuncGetAttributes
//
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -Itests -o /tmp/pdl_probe tools/pdl_probe.cu \
//        tests/gpu/dependent_launch_kernels.cu && /tmp/pdl_probe
// (run it once more under CUDA_MODULE_LOADING=EAGER to compare).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "gpu/dependent_launch_kernels.h"

namespace {

using fusedattn::testing::DeviceCopy;

constexpr uint64_t kLateNs = 2'000'000;
constexpr uint32_t kOld = 0x01234567u, kNew = 0x89abcdefu;
// The device words: [0] the one replaced late, [4] its new value (16-byte aligned), [8] what the
// peek read.
constexpr int kWords = 12, kTarget = 0, kSource = 4, kSeen = 8;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

__global__ void attributes_peek(const uint32_t* src, uint32_t* seen) {
  *seen = *static_cast<const volatile uint32_t*>(src);
}

// Launches the late write and then `peek` (the test's peek where null) behind it.
bool starts_early(cudaStream_t stream, uint32_t* words, fusedattn::testing::PeekKernel peek) {
  uint32_t init[kWords] = {};
  init[kTarget] = kOld;
  init[kSource] = kNew;
  check(cudaMemcpy(words, init, sizeof(init), cudaMemcpyHostToDevice), "reset");
  const DeviceCopy copy{words + kTarget, words + kSource, 4 * sizeof(uint32_t)};
  check(fusedattn::testing::launch_late_copies(&copy, 1, kLateNs, stream), "late copy");
  check(peek ? fusedattn::testing::launch_peek_as_dependent(peek, words + kTarget, words + kSeen, stream)
             : fusedattn::testing::launch_early_peek(words + kTarget, words + kSeen, stream),
        "peek");
  check(cudaStreamSynchronize(stream), "sync");
  uint32_t seen = 0;
  check(cudaMemcpy(&seen, words + kSeen, sizeof(seen), cudaMemcpyDeviceToHost), "seen");
  return seen == kOld;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  std::printf("%s, CUDA_MODULE_LOADING=%s\n", prop.name, loading ? loading : "(unset)");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  uint32_t* words;
  check(cudaMalloc(&words, kWords * sizeof(uint32_t)), "words");
  const DeviceCopy none{words, words, 0};
  check(fusedattn::testing::launch_late_copies(&none, 1, 0, stream), "warm late copy");  // loaded, run once
  check(cudaStreamSynchronize(stream), "warm late copy");

  const bool first = starts_early(stream, words, nullptr);
  const bool warmed = starts_early(stream, words, nullptr);
  cudaFuncAttributes attributes;
  check(cudaFuncGetAttributes(&attributes, attributes_peek), "attributes");
  const bool loaded = starts_early(stream, words, attributes_peek);
  std::printf("dependent launch started early: first launch %s, warmed %s, attributes %s\n", first ? "yes" : "no",
              warmed ? "yes" : "no", loaded ? "yes" : "no");
  check(cudaFree(words), "free");
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
