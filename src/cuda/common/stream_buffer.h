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
  char* base = nullptr;  // null: it had to grow during a graph capture and the driver refused
  bool grown = false;    // freshly allocated: its contents are undefined
};

// At least `bytes` on the current device for `user` and `stream`. Throws fusedattn::Error
// (kRuntime) when an allocation fails. Where the stream is being captured into a CUDA graph, a
// buffer that has to grow is allocated and zeroed outside the graph (not grown, then: zero).
StreamBuffer stream_buffer(StreamBufferUser user, cudaStream_t stream, int64_t bytes);

}  // namespace fusedattn::cuda
