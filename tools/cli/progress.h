// Progress of long phases on stderr. Quiet for the first seconds so that short runs print nothing
// but their result row; after that one line per interval. Safe to call from several threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>

namespace fusedattn::cli {

class Progress {
 public:
  void update(const char* phase, int64_t done, int64_t total) {
    using namespace std::chrono;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto now = steady_clock::now();
    if (now - start_ < kQuietPeriod || now - last_ < kInterval) return;
    last_ = now;
    std::fprintf(stderr, "fusedattn: %s %lld/%lld (%.0f s)\n", phase, static_cast<long long>(done),
                 static_cast<long long>(total), duration<double>(now - start_).count());
  }

 private:
  static constexpr std::chrono::seconds kQuietPeriod{2};
  static constexpr std::chrono::seconds kInterval{2};
  std::mutex mutex_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace fusedattn::cli
