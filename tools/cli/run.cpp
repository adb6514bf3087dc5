#include "run.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "device_memory.h"
#include "progress.h"
#include "workload.h"

namespace fusedattn::cli {
namespace {

constexpr double kMsPerSecond = 1e3;
constexpr double kFlopsPerTflop = 1e12;

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t mid = xs.size() / 2;
  return xs.size() % 2 ? xs[mid] : (xs[mid - 1] + xs[mid]) / 2;
}

}  // namespace

RunResult run(const RunConfig& c) {
  RunResult result;
  result.device = device_name(c.backend);
  Progress progress;
  Workload w(c);
  w.randomize();

  // The checked call: outputs poisoned with NaN first, so anything the backend fails to write
  // shows up in the check. The backward needs the forward's out and lse as its inputs.
  w.poison_forward_outputs();
  forward(w.forward_args());
  w.fetch_forward_outputs();
  if (c.backward) {
    w.allocate_workspace();
    auto checked_backward = [&] {
      w.poison_backward_outputs();
      backward(w.backward_args());
      w.fetch_backward_outputs();
    };
    checked_backward();
    if (c.deterministic) {  // the same call again, bit for bit
      const std::vector<unsigned char> first[] = {w.dq.host_bytes(), w.dk.host_bytes(), w.dv.host_bytes()};
      checked_backward();
      result.repeat_identical =
          first[0] == w.dq.host_bytes() && first[1] == w.dk.host_bytes() && first[2] == w.dv.host_bytes();
    }
  }

  const ForwardArgs fwd = w.forward_args(/*timed=*/true);
  const BackwardArgs bwd = c.backward ? w.backward_args() : BackwardArgs{};
  auto call = [&] { c.backward ? backward(bwd) : forward(fwd); };
  for (int i = 0; i < c.warmup; ++i) {
    call();
    progress.update("warmup", i + 1, c.warmup);
  }
  CallTimer timer(c.on_device());
  std::vector<double> times, host_times;
  for (int i = 0; i < c.iters; ++i) {
    timer.start();
    // The call's own time on the host up to its return (on a GPU: its checks, plan, tensor maps
    // and launches), which the timer's reading includes, since every call is waited for.
    const auto issued = std::chrono::steady_clock::now();
    call();
    host_times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - issued).count());
    times.push_back(timer.stop_ms());
    progress.update("timed iterations", i + 1, c.iters);
  }
  result.median_ms = median(times);
  result.host_median_ms = median(host_times);
  result.tflops = attention_flops(c) / (result.median_ms / kMsPerSecond) / kFlopsPerTflop;

  result.check = c.backward ? check_backward(w) : check_forward(w);
  if (c.peers_naive) result.naive = time_naive_forward(w, progress);
  return result;
}

}  // namespace fusedattn::cli
