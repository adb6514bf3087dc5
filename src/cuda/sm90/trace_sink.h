// Host side of the tile-boundary trace (trace.cuh), in a build with FUSEDATTN_SM90_TRACE only:
// with FUSEDATTN_SM90_TRACE_FILE=path set, a launch gets a device buffer for its stamps, waits for
// the kernel and appends them to the file as CSV lines (launch, sm, role, event, tile, blocks,
// clock); tools/sm90_trace.py reads them. A diagnostic: it synchronises every launch it traces.
#pragma once

#ifdef FUSEDATTN_SM90_TRACE

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/common/check.cuh"
#include "cuda/sm90/trace.h"

namespace fusedattn::cuda::sm90 {

class TraceSink {
 public:
  // Records one launch may take: ~13 per tile and consumer warpgroup pair, so 4M covers 300k tiles.
  static constexpr uint32_t kCapacity = 1u << 22;

  explicit TraceSink(cudaStream_t stream) : stream_(stream), path_(std::getenv("FUSEDATTN_SM90_TRACE_FILE")) {
    if (path_ == nullptr || path_[0] == '\0') return;
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&buffer_.records, sizeof(TraceRecord) * kCapacity));
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&buffer_.count, sizeof(unsigned long long)));
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(buffer_.count, 0, sizeof(unsigned long long), stream_));
    buffer_.capacity = kCapacity;
  }
  TraceSink(const TraceSink&) = delete;
  TraceSink& operator=(const TraceSink&) = delete;
  ~TraceSink() {
    cudaFree(buffer_.records);
    cudaFree(buffer_.count);
  }

  const TraceBuffer& buffer() const { return buffer_; }

  // After the launch: its stamps appended to the file (a note on stderr if some were dropped).
  void write() const {
    if (buffer_.records == nullptr) return;
    static int launch = 0;
    unsigned long long count = 0;
    FUSEDATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    FUSEDATTN_CUDA_CHECK(cudaMemcpy(&count, buffer_.count, sizeof(count), cudaMemcpyDeviceToHost));
    const size_t kept = count < kCapacity ? static_cast<size_t>(count) : kCapacity;
    if (kept < count) std::fprintf(stderr, "fusedattn trace: %llu stamps, %zu kept\n", count, kept);
    std::vector<TraceRecord> records(kept);
    FUSEDATTN_CUDA_CHECK(
        cudaMemcpy(records.data(), buffer_.records, sizeof(TraceRecord) * kept, cudaMemcpyDeviceToHost));
    std::FILE* f = std::fopen(path_, "a");
    if (f == nullptr) {
      std::fprintf(stderr, "fusedattn trace: cannot open %s\n", path_);
      return;
    }
    for (const TraceRecord& r : records)
      std::fprintf(f, "%d,%u,%d,%u,%d,%d,%llu\n", launch, r.sm, r.role == kProducerRole ? -1 : int{r.role},
                   unsigned{r.event}, r.tile, r.blocks, static_cast<unsigned long long>(r.clock));
    std::fclose(f);
    ++launch;
  }

 private:
  cudaStream_t stream_;
  const char* path_;
  TraceBuffer buffer_;
};

}  // namespace fusedattn::cuda::sm90

#endif  // FUSEDATTN_SM90_TRACE
