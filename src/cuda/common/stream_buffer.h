// Device scratch kept per (device, stream) for each of its users, grown on demand and never freed:
// a CUDA graph captured with one still points at it, and launches on one stream run in order, so
// they share it. The split forwards keep their parts' rows here (sm90/split_workspace.cu,
// sm80/fwd_split_combine.cu), the column-masked forwards their mask's summary (common/column_scratch.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fusedattn::cuda {

enum class StreamBufferUser { kSm90Split, kSm80KvSplit, kColumnSummary };

struct StreamBuffer {
  char* base = nullptr;  // null: it would have to grow while the stream is captured into a graph
  bool grown = false;    // freshly allocated: its contents are undefined
};

// At least `bytes` on the current device for `user` and `stream`. Throws fusedattn::Error
// (kRuntime) when an allocation fails.
StreamBuffer stream_buffer(StreamBufferUser user, cudaStream_t stream, int64_t bytes);

}  // namespace fusedattn::cuda
