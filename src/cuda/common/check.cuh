// CUDA error checking that turns a failed runtime call into fusedattn::Error (kRuntime).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fusedattn/error.h"

namespace fusedattn::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(ErrorCode::kRuntime, "", std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace fusedattn::cuda

#define FUSEDATTN_CUDA_CHECK(call) ::fusedattn::cuda::check_cuda((call), #call)
// After a kernel launch: catches bad launch configurations at once (not asynchronous faults).
#define FUSEDATTN_CHECK_LAUNCH() ::fusedattn::cuda::check_cuda(cudaGetLastError(), "kernel launch")
