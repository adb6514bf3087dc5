// Memory and timing for the backend under test. Every CUDA runtime call the tool makes lives in
// device_memory.cpp, behind FUSEDATTN_WITH_CUDA, so the rest of the tool is plain C++.
#pragma once

#include <chrono>
#include <cstddef>

namespace fusedattn::cli {

// Bytes in the memory the backend reads and writes: host memory for the CPU backend, cudaMalloc'd
// device memory for CUDA. Move-only.
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(std::size_t bytes, bool on_device);
  ~BackendBuffer();
  BackendBuffer(BackendBuffer&& other) noexcept;
  BackendBuffer& operator=(BackendBuffer&& other) noexcept;
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  bool on_device() const { return on_device_; }

  void upload(const void* host);     // bytes() bytes from host memory
  void download(void* host) const;   // bytes() bytes to host memory
  void fill_bytes(unsigned char value);

 private:
  void release() noexcept;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool on_device_ = false;
};

// Times one call. On the GPU: CUDA events on the default stream, so the figure is device time
// and not launch overhead. On the CPU: steady_clock, since CPU calls return when they are done.
class CallTimer {
 public:
  explicit CallTimer(bool on_device);
  ~CallTimer();
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

  void start();
  double stop_ms();  // waits for the call to finish

 private:
  bool on_device_;
  void* start_event_ = nullptr;
  void* stop_event_ = nullptr;
  std::chrono::steady_clock::time_point start_time_{};
};

}  // namespace fusedattn::cli
