// Attributes of the CUDA device current on the calling host thread: what the launchers decide
// with (a tile row's shared memory, the persistent grid's size, the schedule's share of the L2).
// The driver answers these from its own table; no synchronisation, so a per-launch query is cheap.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace fusedattn::cuda {

inline int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  FUSEDATTN_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

}  // namespace fusedattn::cuda
