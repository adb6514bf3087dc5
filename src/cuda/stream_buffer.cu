#include "cuda/common/stream_buffer.h"

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"

namespace fusedattn::cuda {

namespace {

// `bytes` of zeroed device memory, allocated and zeroed while the calling thread's stream is being
// captured into a CUDA graph, none of it in the graph: the graph then points at the buffer as an
// eager launch would, with no allocation or memset node to run at every replay. The capture's own
// mode (torch captures in the global one) forbids cudaMalloc; a library may relax this thread's
// mode for such a call (cudaThreadExchangeStreamCaptureMode). The zeroing goes on a stream of its
// own, waited for at once, so the captured stream sees none of it. Null where the driver refuses.
// Without this a decode step captured on a stream that never ran one outside a capture (a
// serving engine's capture stream) ran its few tiles whole, 3-7x slower at batch 1 (docs/hopper.md,
// session 92).
char* allocate_beside_capture(int64_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) return nullptr;
  char* buffer = nullptr;
  cudaStream_t zeroing = nullptr;
  bool ok = cudaMalloc(&buffer, bytes) == cudaSuccess &&
            cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMemsetAsync(buffer, 0, bytes, zeroing) == cudaSuccess && cudaStreamSynchronize(zeroing) == cudaSuccess;
  if (zeroing != nullptr) ok = cudaStreamDestroy(zeroing) == cudaSuccess && ok;
  if (!ok && buffer != nullptr) {
    (void)cudaFree(buffer);
    buffer = nullptr;
  }
  (void)cudaGetLastError();  // a refusal leaves the launch to run without the buffer
  (void)cudaThreadExchangeStreamCaptureMode(&mode);  // the capture's mode back
  return buffer;
}

}  // namespace

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
  // During a capture the buffer comes zeroed, so its users need no start values from the graph.
  const bool zeroed = capturing(stream);
  char* grown = nullptr;
  if (zeroed) {
    grown = allocate_beside_capture(bytes);
    if (grown == nullptr) return {};
  } else {
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&grown, bytes));
  }
  if (buf.base != nullptr) retired.push_back(buf.base);
  buf = {grown, bytes};
  return {grown, !zeroed};
}

}  // namespace fusedattn::cuda
