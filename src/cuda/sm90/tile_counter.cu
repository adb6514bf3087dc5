#include "cuda/sm90/tile_counter.h"

#include <map>
#include <mutex>
#include <utility>

#include "cuda/common/check.cuh"

namespace fusedattn::cuda::sm90 {

int* tile_counter(cudaStream_t stream) {
  static std::mutex mutex;
  // Counters live as long as the process: a stream handle that is destroyed and reused finds
  // its counter at zero, since every launch resets it.
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  int*& counter = counters[{device, stream}];
  if (counter == nullptr) {
    int* fresh = nullptr;
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&fresh, sizeof(int)));
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(fresh, 0, sizeof(int), stream));
    counter = fresh;
  }
  return counter;
}

}  // namespace fusedattn::cuda::sm90
