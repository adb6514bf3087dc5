// Attributes of a CUDA device (by index, or the one current on the calling host thread): what
// the launchers decide with (a tile row's shared memory, the persistent grid's size, the
// schedule's share of the L2).
// The driver answers these from its own table; no synchronisation, so a per-launch query is cheap.
// Also whether a stream is being captured into a CUDA graph, where no allocation or host read
// may happen, and a guard that runs a call on a given device.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"

namespace fusedattn::cuda {

inline int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  FUSEDATTN_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

inline int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  return device_attribute(attribute, device);
}

// Runs a call on the tensors' device and restores the caller's current device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    FUSEDATTN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (index != previous_) FUSEDATTN_CUDA_CHECK(cudaSetDevice(index));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FUSEDATTN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace fusedattn::cuda
