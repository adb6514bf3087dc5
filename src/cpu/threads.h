// A minimal fork-join pool: tasks [0, n) are handed out through one atomic counter to
// std::threads started for this call. Each task must write only outputs it owns, so the result
// never depends on which thread ran which task (the CPU backend is deterministic by design).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "cpu/isa.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// requested <= 0 means "all hardware threads"; never more threads than tasks.
inline int resolve_num_threads(int requested, int64_t num_tasks) {
  int64_t n = requested > 0 ? requested : static_cast<int64_t>(std::thread::hardware_concurrency());
  n = std::min(std::max<int64_t>(n, 1), std::max<int64_t>(num_tasks, 1));
  return static_cast<int>(n);
}

// make_state() runs once on each worker thread (its scratch buffers); run(state, task) runs every
// task. The first exception thrown by any worker stops the hand-out and is rethrown here.
template <class MakeState, class Run>
void parallel_for(int64_t num_tasks, int num_threads, MakeState make_state, Run run) {
  if (num_tasks <= 0) return;
  const int workers = resolve_num_threads(num_threads, num_tasks);
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      auto state = make_state();
      for (int64_t task = next.fetch_add(1); task < num_tasks; task = next.fetch_add(1)) run(state, task);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(num_tasks);  // the others finish their current task and stop
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (int t = 1; t < workers; ++t) {
    try {
      threads.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // the system refused another thread: the ones already running take every task
    }
  }
  worker();  // the calling thread works too
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
