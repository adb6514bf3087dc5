#include "cuda/common/stream_buffer.h"

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"

namespace fusedattn::cuda {

StreamBuffer stream_buffer(StreamBufferUser user, cudaStream_t stream, int64_t bytes) {
  struct Buffer {
    char* base = nullptr;
    int64_t bytes = 0;
  };
  static std::mutex mutex;
  static std::map<std::tuple<StreamBufferUser, int, cudaStream_t>, Buffer> buffers;
  static std::vector<char*> retired;  // outgrown buffers, kept for the graphs that use them
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  Buffer& buf = buffers[{user, device, stream}];
  if (buf.bytes >= bytes) return {buf.base, false};
  if (capturing(stream)) return {};
  char* grown = nullptr;
  FUSEDATTN_CUDA_CHECK(cudaMalloc(&grown, bytes));
  if (buf.base != nullptr) retired.push_back(buf.base);
  buf = {grown, bytes};
  return {grown, true};
}

}  // namespace fusedattn::cuda
