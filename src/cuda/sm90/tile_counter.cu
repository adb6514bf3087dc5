#include "cuda/sm90/tile_counter.h"

#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"

namespace fusedattn::cuda::sm90 {

int* tile_counter(cudaStream_t stream) {
  static std::mutex mutex;
  // Counters live as long as the process: a stream handle that is destroyed and reused finds
  // its counter at zero, since every launch resets it.
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = counters.find({device, stream});
  if (found != counters.end()) return found->second;
  // cudaMalloc is not allowed while the stream is being captured into a CUDA graph (torch's
  // CUDA graphs, torch.compile's "reduce-overhead"): the caller then schedules statically.
  if (capturing(stream)) return nullptr;
  int* counter = nullptr;
  FUSEDATTN_CUDA_CHECK(cudaMalloc(&counter, sizeof(int)));
  FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  counters[{device, stream}] = counter;
  return counter;
}

}  // namespace fusedattn::cuda::sm90
