// The dynamic tile scheduler's counter (tile_scheduler.cuh): one int in device memory per
// (device, stream), zeroed on the stream when first handed out. Every launch leaves it at zero
// again and launches on one stream run one after another, so they share it without a reset of
// their own; launches on different streams get different counters.
#pragma once

#include <cuda_runtime.h>

namespace fusedattn::cuda::sm90 {

// Throws fusedattn::Error(kRuntime) when the allocation fails. Not for use inside a CUDA graph
// capture the first time a stream is seen (it allocates).
int* tile_counter(cudaStream_t stream);

}  // namespace fusedattn::cuda::sm90
