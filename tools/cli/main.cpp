// fusedattn: runs one fused-attention workload on the CPU or CUDA backend and prints one result
// row (time, TFLOP/s, sampled float64 check). `fusedattn --help` lists the flags.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <thread>

#include "cli_options.h"
#include "fusedattn/attention.h"
#include "fusedattn/error.h"
#include "parallel.h"
#include "run.h"

namespace {

using namespace fusedattn;
using namespace fusedattn::cli;

enum ExitCode : int { kOk = 0, kError = 1, kUsage = 2, kCheckFailed = 3 };

void print_row(const RunConfig& c, const RunResult& r) {
  std::printf("backend=%s device=\"%s\"", backend_name(c.backend), r.device.c_str());
  if (!c.on_device()) std::printf(" threads=%d", resolve_threads(c.threads));
  std::printf(" pass=%s dtype=%s layout=%s shape=\"%s\" mask=%s kv=%s time_ms=%.4f host_ms=%.4f tflops=%.3f max_err=%s check=%s",
              c.backward ? "bwd" : "fwd", dtype_name(c.dtype), layout_name(c.layout), c.shape_str().c_str(),
              c.mask_str().c_str(), c.kv_str().c_str(), r.median_ms, r.host_median_ms, r.tflops, r.check.str().c_str(),
              r.check.tensors.empty() ? "off" : (r.check.passed() ? "pass" : "FAIL"));
  if (c.scale) std::printf(" softmax_scale=%.9g", *c.scale);
  if (r.repeat_identical) std::printf(" repeat=%s", *r.repeat_identical ? "identical" : "DIFFERS");
  if (r.naive) {
    const NaiveTiming& n = *r.naive;
    std::printf(" naive_f64_ms=%.1f naive_speedup=%.1fx naive_note=\"%s%lld/%lld heads, %d threads\"", n.ms,
                n.ms / r.median_ms, n.scaled() ? "scaled from " : "", static_cast<long long>(n.heads_timed),
                static_cast<long long>(n.heads_total), n.workers);
  }
  std::printf("\n");
}

// GiB of the workload's tensors: q, k, v and out, with --backward also dout, dq, dk and dv (on
// the device for CUDA runs, plus the host copies the check reads).
double workload_gib(const RunConfig& c) {
  const double tensors = (2 * c.q_elements() + 2 * c.kv_elements()) * (c.backward ? 2 : 1);
  return tensors * static_cast<double>(dtype_size(c.dtype)) / (1u << 30);
}

}  // namespace

int main(int argc, char** argv) {
  RunConfig config;
  try {
    const CliArgs args = parse_args(argc, argv);
    if (args.help) {
      std::fputs(usage().c_str(), stdout);
      return kOk;
    }
    config = resolve(args, cuda_available());
  } catch (const UsageError& e) {
    std::fprintf(stderr, "fusedattn: %s\n%s", e.what(), usage().c_str());
    return kUsage;
  }
  try {
    if (config.on_device() && !cuda_available())
      throw Error(ErrorCode::kBackendUnavailable, "backend",
                  "cuda was requested but this build has no CUDA backend or no GPU is visible");
    const RunResult result = run(config);
    print_row(config, result);
    return result.passed() ? kOk : kCheckFailed;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory: the workload's tensors (%s) take %.1f GiB; lower --batch, "
                 "--heads or the lengths\n", config.shape_str().c_str(), workload_gib(config));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return kError;
}
