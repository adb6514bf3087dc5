// The dynamic tile scheduler's counter (tile_scheduler.cuh): one int in device memory per
// (device, stream), zeroed on the stream when first handed out. Every launch leaves it at zero
// again and launches on one stream run one after another, so they share it without a reset of
// their own; launches on different streams get different counters.
#pragma once

#include <cuda_runtime.h>

namespace fusedattn::cuda::sm90 {

// Throws fusedattn::Error(kRuntime) when the allocation fails. Returns nullptr when the stream has
// no counter yet and is being captured into a CUDA graph (allocation is not allowed there): the
// launch then uses a static schedule. A counter made before the capture is captured by pointer.
int* tile_counter(cudaStream_t stream);

}  // namespace fusedattn::cuda::sm90
