// A minimal fork-join loop for the tool's host work (input generation, the float64 check, the
// naive peer): [0, n) split into contiguous chunks, one std::thread each.
#pragma once

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace fusedattn::cli {

// The thread count the tool uses for `requested` (0 = every hardware thread).
inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Calls body(begin, end) on disjoint ranges covering [0, n), from up to `threads` threads. Where
// the system refuses a thread (--threads 100000), the calling thread takes the ranges left: a
// vector of running threads must never be destroyed unjoined (std::terminate).
template <typename Body>
void parallel_for(int64_t n, int threads, Body&& body) {
  const int64_t workers = std::min<int64_t>(std::max(threads, 1), n);
  if (workers <= 1) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
  const auto run_range = [&](int64_t w) { body(n * w / workers, n * (w + 1) / workers); };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers - 1));
  int64_t started = 1;  // range 0 is the calling thread's
  for (; started < workers; ++started) {
    try {
      pool.emplace_back([&run_range, w = started] { run_range(w); });
    } catch (const std::system_error&) {
      break;
    }
  }
  run_range(0);
  for (int64_t w = started; w < workers; ++w) run_range(w);
  for (std::thread& t : pool) t.join();
}

}  // namespace fusedattn::cli
