// Whether this device starts a dependent launch (programmatic stream serialisation) before the
// kernel ahead of it on the stream has ended, and what stops it. A one-CTA kernel lets dependents
// start at once (griddepcontrol.launch_dependents) and replaces a word 2 ms later; a dependent
// kernel right behind it reads the word without waiting. Early: it read the old word.
//
// Each way is tried on a fresh peek kernel (a module loaded lazily is loaded at its first launch,
// CUDA_MODULE_LOADING=LAZY being the default since CUDA 12.2):
//   first launch  the peek's first launch ever
//   warmed        the same peek again, once it has run
//   attributes    another peek, loaded before by cudaFuncGetAttributes
//
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -o /tmp/pdl_probe tools/pdl_probe.cu && /tmp/pdl_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr uint64_t kLateNs = 2'000'000;
constexpr unsigned kSleepNs = 1000;
constexpr uint32_t kOld = 0x01234567u, kNew = 0x89abcdefu;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void late_write(uint32_t* word) {
  cudaTriggerProgrammaticLaunchCompletion();
  const uint64_t start = global_ns();
  while (global_ns() - start < kLateNs) __nanosleep(kSleepNs);
  *word = kNew;
}

// Three copies of one peek, so that each way starts from a kernel in its own state.
template <int kWay>
__global__ void peek(const uint32_t* word, uint32_t* seen) {
  *seen = *static_cast<const volatile uint32_t*>(word);
}

template <int kWay>
bool starts_early(cudaStream_t stream, uint32_t* words) {
  check(cudaMemcpy(words, &kOld, sizeof(kOld), cudaMemcpyHostToDevice), "reset");
  late_write<<<1, 32, 0, stream>>>(words);
  check(cudaGetLastError(), "late_write");
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(1);
  config.stream = stream;
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &dependent;
  config.numAttrs = 1;
  check(cudaLaunchKernelEx(&config, peek<kWay>, static_cast<const uint32_t*>(words), words + 1), "peek");
  check(cudaStreamSynchronize(stream), "sync");
  uint32_t seen = 0;
  check(cudaMemcpy(&seen, words + 1, sizeof(seen), cudaMemcpyDeviceToHost), "seen");
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
  check(cudaMalloc(&words, 2 * sizeof(uint32_t)), "words");
  late_write<<<1, 32, 0, stream>>>(words);  // late_write itself loaded and run once
  check(cudaStreamSynchronize(stream), "warm late_write");

  const bool first = starts_early<0>(stream, words);
  const bool warmed = starts_early<0>(stream, words);
  cudaFuncAttributes attributes;
  check(cudaFuncGetAttributes(&attributes, peek<1>), "attributes");
  const bool loaded = starts_early<1>(stream, words);
  std::printf("dependent launch started early: first launch %s, warmed %s, attributes %s\n", first ? "yes" : "no",
              warmed ? "yes" : "no", loaded ? "yes" : "no");
  check(cudaFree(words), "free");
  check(cudaStreamDestroy(stream), "stream");
  return 0;
}
