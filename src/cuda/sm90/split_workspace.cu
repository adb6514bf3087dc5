#include "cuda/sm90/split_workspace.h"

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"
#include "cuda/common/stream_buffer.h"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

namespace {

// The O and LSE slots start at this alignment (float4-friendly, and a cache line).
constexpr int64_t kSlotAlignBytes = 128;

int64_t align_up(int64_t bytes) { return round_up(bytes, int64_t{kSlotAlignBytes}); }

}  // namespace

SplitWorkspace split_workspace(cudaStream_t stream, int64_t max_split_tiles, int64_t split_tiles, int parts,
                               int block_m, int head_dim) {
  if (split_tiles > max_split_tiles) return {};
  const int64_t ticket_bytes = align_up(max_split_tiles * kMaxConsumerWarpgroups * int64_t{sizeof(int)});
  const int64_t lse_bytes = align_up(split_tiles * parts * block_m * int64_t{sizeof(float)});
  const int64_t o_bytes = split_tiles * parts * block_m * int64_t{head_dim} * int64_t{sizeof(float)};
  const int64_t need = ticket_bytes + lse_bytes + o_bytes;

  const StreamBuffer buf = stream_buffer(StreamBufferUser::kSm90Split, stream, need);
  if (buf.base == nullptr) return {};
  // Only the counters need a start value; the O and LSE slots are written before they are read.
  if (buf.grown) FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(buf.base, 0, ticket_bytes, stream));
  SplitWorkspace ws;
  ws.tickets = reinterpret_cast<int*>(buf.base);
  ws.lse = reinterpret_cast<float*>(buf.base + ticket_bytes);
  ws.o = reinterpret_cast<float*>(buf.base + ticket_bytes + lse_bytes);
  return ws;
}

}  // namespace fusedattn::cuda::sm90
