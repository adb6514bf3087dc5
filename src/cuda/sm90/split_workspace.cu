#include "cuda/sm90/split_workspace.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

namespace {

// The O and LSE slots start at this alignment (float4-friendly, and a cache line).
constexpr int64_t kSlotAlignBytes = 128;

int64_t align_up(int64_t bytes) { return round_up(bytes, int64_t{kSlotAlignBytes}); }

struct Buffer {
  char* base = nullptr;
  int64_t bytes = 0;
};

}  // namespace

SplitWorkspace split_workspace(cudaStream_t stream, int64_t max_split_tiles, int64_t split_tiles, int parts,
                               int block_m, int head_dim) {
  if (split_tiles > max_split_tiles) return {};
  const int64_t ticket_bytes = align_up(max_split_tiles * kMaxConsumerWarpgroups * int64_t{sizeof(int)});
  const int64_t lse_bytes = align_up(split_tiles * parts * block_m * int64_t{sizeof(float)});
  const int64_t o_bytes = split_tiles * parts * block_m * int64_t{head_dim} * int64_t{sizeof(float)};
  const int64_t need = ticket_bytes + lse_bytes + o_bytes;

  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, Buffer> buffers;
  // Outgrown buffers are kept, never freed: a CUDA graph captured with one still points at it.
  static std::vector<char*> retired;
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  Buffer& buf = buffers[{device, stream}];
  if (buf.bytes < need) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    FUSEDATTN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) return {};
    char* grown = nullptr;
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&grown, need));
    // Only the counters need a start value; the O and LSE slots are written before they are read.
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(grown, 0, ticket_bytes, stream));
    if (buf.base != nullptr) retired.push_back(buf.base);
    buf = {grown, need};
  }
  SplitWorkspace ws;
  ws.tickets = reinterpret_cast<int*>(buf.base);
  ws.lse = reinterpret_cast<float*>(buf.base + ticket_bytes);
  ws.o = reinterpret_cast<float*>(buf.base + ticket_bytes + lse_bytes);
  return ws;
}

}  // namespace fusedattn::cuda::sm90
