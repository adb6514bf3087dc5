// One run of the tool: inputs, the checked call, warmup, timed iterations, the check, the peer.
#pragma once

#include <optional>
#include <string>

#include "check.h"
#include "cli_options.h"
#include "naive.h"

namespace fusedattn::cli {

struct RunResult {
  std::string device;
  double median_ms = 0;       // a call's time, waited for (on a GPU: from before its host work to its kernels' end)
  double host_median_ms = 0;  // a call's time on the host up to its return (on a GPU: before its kernels finish)
  double tflops = 0;  // FlashAttention convention, see attention_flops()
  CheckReport check;
  // --deterministic: whether a second checked backward gave dq, dk and dv bit for bit again.
  std::optional<bool> repeat_identical;
  std::optional<NaiveTiming> naive;
  bool passed() const { return check.passed() && repeat_identical.value_or(true); }
};

// Throws fusedattn::Error for anything the library or the CUDA runtime rejects.
RunResult run(const RunConfig& config);

}  // namespace fusedattn::cli
