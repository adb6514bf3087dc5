// Where a column-masked forward keeps its mask's summary (common/column_summary.h) for one launch,
// and, if asked, room for its CTAs' work estimates and order (common/work_order.h): the stream's
// buffer (the next call on the stream may overwrite it: launches on one stream run in order), or,
// where that buffer would have to grow while the stream is captured into a CUDA graph (torch's
// graphs capture on streams the library may not have seen), a stream-ordered allocation that the
// graph records and frees itself (`owned`, freed after the kernel by release()).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/column_summary.h"
#include "cuda/common/int_math.h"
#include "cuda/common/stream_buffer.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

struct ColumnScratch {
  ColumnSummary summary;
  int* work = nullptr;   // work_ints ints, or null
  int* order = nullptr;  // order_ints ints, or null
  void* owned = nullptr;

  // The summary of p's mask over key blocks of block_keys keys, written on p.stream, and room for
  // work_ints and order_ints ints (none where 0).
  static ColumnScratch of(const FwdParams& p, int block_keys, int64_t work_ints = 0, int64_t order_ints = 0) {
    const auto stream = static_cast<cudaStream_t>(p.stream);
    const int64_t summary_bytes = round_up(column_summary_bytes(p, block_keys), kAlign);
    // No keys: no block to summarise (the kernel visits none), and nothing to allocate.
    if (summary_bytes == 0) return {};
    const int64_t work_bytes = round_up(work_ints * int64_t{sizeof(int)}, kAlign);
    const int64_t bytes = summary_bytes + work_bytes + order_ints * int64_t{sizeof(int)};
    const StreamBuffer buf = stream_buffer(StreamBufferUser::kColumnSummary, stream, bytes);
    ColumnScratch s;
    char* base = buf.base;
    if (base == nullptr) {
      FUSEDATTN_CUDA_CHECK(cudaMallocAsync(&s.owned, static_cast<size_t>(bytes), stream));
      base = static_cast<char*>(s.owned);
    }
    s.summary = summarize_column_mask(p, block_keys, reinterpret_cast<int4*>(base));
    if (work_ints > 0) s.work = reinterpret_cast<int*>(base + summary_bytes);
    if (order_ints > 0) s.order = reinterpret_cast<int*>(base + summary_bytes + work_bytes);
    return s;
  }

  void release(cudaStream_t stream) const {
    if (owned != nullptr) FUSEDATTN_CUDA_CHECK(cudaFreeAsync(owned, stream));
  }

 private:
  static constexpr int64_t kAlign = 256;  // each part starts on its own cache lines
};

}  // namespace fusedattn::cuda
