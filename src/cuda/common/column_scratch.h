// Where a column-masked forward keeps its mask's summary (common/column_summary.h) for one launch:
// the stream's buffer (the next call on the stream may overwrite it: launches on one stream run in
// order), or, where that buffer would have to grow while the stream is captured into a CUDA graph
// (torch's graphs capture on streams the library may not have seen), a stream-ordered allocation
// that the graph records and frees itself (`owned`, freed after the kernel by release()). Both
// forwards use it (sm80/fwd_launch.cuh, sm90/fwd_launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/column_summary.h"
#include "cuda/common/stream_buffer.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

struct ColumnScratch {
  ColumnSummary summary;
  int4* owned = nullptr;

  // The summary of p's mask over key blocks of kBlockKeys keys, written on p.stream.
  template <int kBlockKeys>
  static ColumnScratch of(const FwdParams& p) {
    static_assert(kBlockKeys <= kColumnSummaryMaxBlockKeys, "a block's run ends fit their bytes");
    const auto stream = static_cast<cudaStream_t>(p.stream);
    const int64_t bytes = column_summary_bytes(p, kBlockKeys);
    // No keys: no block to summarise (the kernel visits none), and nothing to allocate.
    if (bytes == 0) return {};
    const StreamBuffer buf = stream_buffer(StreamBufferUser::kColumnSummary, stream, bytes);
    ColumnScratch s;
    int4* bounds = reinterpret_cast<int4*>(buf.base);
    if (bounds == nullptr) {
      FUSEDATTN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&s.owned), static_cast<size_t>(bytes), stream));
      bounds = s.owned;
    }
    s.summary = summarize_column_mask(p, kBlockKeys, bounds);
    return s;
  }

  void release(cudaStream_t stream) const {
    if (owned != nullptr) FUSEDATTN_CUDA_CHECK(cudaFreeAsync(owned, stream));
  }
};

}  // namespace fusedattn::cuda
