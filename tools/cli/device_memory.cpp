#include "device_memory.h"

#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "fusedattn/error.h"

#if FUSEDATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fusedattn::cli {
namespace {

// Host buffers are aligned like device allocations so the CPU backend may use wide vector loads.
constexpr std::align_val_t kHostAlignment{256};

#if FUSEDATTN_WITH_CUDA
void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(ErrorCode::kRuntime, "cuda", std::string(what) + " failed: " + cudaGetErrorString(status));
}
#else
[[noreturn]] void no_cuda() {
  throw Error(ErrorCode::kBackendUnavailable, "backend",
              "this build of the fusedattn tool has no CUDA support; use --backend cpu");
}
#endif

}  // namespace

BackendBuffer::BackendBuffer(std::size_t bytes, bool on_device) : bytes_(bytes), on_device_(on_device) {
  if (bytes == 0) return;
  if (!on_device) {
    data_ = ::operator new(bytes, kHostAlignment);
    return;
  }
#if FUSEDATTN_WITH_CUDA
  // The size in the message: a workload too large for the GPU fails here.
  const std::string what = "cudaMalloc of " + std::to_string(bytes >> 20) + " MiB";
  check(cudaMalloc(&data_, bytes), what.c_str());
#else
  no_cuda();
#endif
}

BackendBuffer::~BackendBuffer() { release(); }

BackendBuffer::BackendBuffer(BackendBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      on_device_(other.on_device_) {}

BackendBuffer& BackendBuffer::operator=(BackendBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    on_device_ = other.on_device_;
  }
  return *this;
}

void BackendBuffer::release() noexcept {
  if (data_ == nullptr) return;
  if (!on_device_) {
    ::operator delete(data_, kHostAlignment);
  } else {
#if FUSEDATTN_WITH_CUDA
    cudaFree(data_);  // nothing useful to do with a failure while releasing
#endif
  }
  data_ = nullptr;
}

void BackendBuffer::upload(const void* host) {
  if (bytes_ == 0) return;
  if (!on_device_) {
    std::memcpy(data_, host, bytes_);
    return;
  }
#if FUSEDATTN_WITH_CUDA
  check(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
#else
  no_cuda();
#endif
}

void BackendBuffer::download(void* host) const {
  if (bytes_ == 0) return;
  if (!on_device_) {
    std::memcpy(host, data_, bytes_);
    return;
  }
#if FUSEDATTN_WITH_CUDA
  check(cudaMemcpy(host, data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
#else
  no_cuda();
#endif
}

void BackendBuffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  if (!on_device_) {
    std::memset(data_, value, bytes_);
    return;
  }
#if FUSEDATTN_WITH_CUDA
  check(cudaMemset(data_, value, bytes_), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  no_cuda();
#endif
}

CallTimer::CallTimer(bool on_device) : on_device_(on_device) {
  if (!on_device_) return;
#if FUSEDATTN_WITH_CUDA
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  start_event_ = a;
  stop_event_ = b;
#else
  no_cuda();
#endif
}

CallTimer::~CallTimer() {
#if FUSEDATTN_WITH_CUDA
  if (start_event_) cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
#endif
}

void CallTimer::start() {
  if (!on_device_) {
    start_time_ = std::chrono::steady_clock::now();
    return;
  }
#if FUSEDATTN_WITH_CUDA
  check(cudaEventRecord(static_cast<cudaEvent_t>(start_event_)), "cudaEventRecord");
#endif
}

double CallTimer::stop_ms() {
  if (!on_device_)
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_time_).count();
#if FUSEDATTN_WITH_CUDA
  auto stop = static_cast<cudaEvent_t>(stop_event_);
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.f;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_event_), stop), "cudaEventElapsedTime");
  return ms;
#else
  return 0.0;
#endif
}

}  // namespace fusedattn::cli
