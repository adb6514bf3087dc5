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
  // Records one launch may take, shared out among its CTAs' roles (trace.h): a persistent grid of
  // 132 CTAs gets ~4000 per role, ~280 tiles' worth (a consumer warpgroup stamps up to 14 times a
  // tile); a grid of one CTA per tile, one tile's worth in up to ~37k CTAs.
  static constexpr uint32_t kCapacity = 1u << 21;

  explicit TraceSink(cudaStream_t stream) : stream_(stream), path_(std::getenv("FUSEDATTN_SM90_TRACE_FILE")) {
    if (path_ == nullptr || path_[0] == '\0') return;
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&buffer_.records, sizeof(TraceRecord) * kCapacity));
    FUSEDATTN_CUDA_CHECK(cudaMalloc(&buffer_.dropped, sizeof(unsigned long long)));
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(buffer_.records, 0, sizeof(TraceRecord) * kCapacity, stream_));
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(buffer_.dropped, 0, sizeof(unsigned long long), stream_));
  }
  TraceSink(const TraceSink&) = delete;
  TraceSink& operator=(const TraceSink&) = delete;
  ~TraceSink() {
    cudaFree(buffer_.records);
    cudaFree(buffer_.dropped);
  }

  // The buffer for a launch of `ctas` CTAs: each (CTA, role) gets an equal stretch.
  TraceBuffer buffer(int64_t ctas) const {
    TraceBuffer b = buffer_;
    b.per_role = static_cast<uint32_t>(kCapacity / (ctas * kTraceRoles));
    return b;
  }

  // After the launch: its stamps (the records taken, clock != 0) appended to the file, and a note
  // on stderr if some were dropped.
  void write() const {
    if (buffer_.records == nullptr) return;
    static int launch = 0;
    unsigned long long dropped = 0;
    FUSEDATTN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    FUSEDATTN_CUDA_CHECK(cudaMemcpy(&dropped, buffer_.dropped, sizeof(dropped), cudaMemcpyDeviceToHost));
    if (dropped > 0) std::fprintf(stderr, "fusedattn trace: %llu stamps dropped (a role's share was full)\n", dropped);
    std::vector<TraceRecord> records(kCapacity);
    FUSEDATTN_CUDA_CHECK(
        cudaMemcpy(records.data(), buffer_.records, sizeof(TraceRecord) * kCapacity, cudaMemcpyDeviceToHost));
    std::FILE* f = std::fopen(path_, "a");
    if (f == nullptr) {
      std::fprintf(stderr, "fusedattn trace: cannot open %s\n", path_);
      return;
    }
    for (const TraceRecord& r : records)
      if (r.clock != 0)
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
