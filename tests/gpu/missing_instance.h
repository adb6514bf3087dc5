// The GPU tests' skip rule for a head dim the build did not compile (GPU_HEAD_DIMS builds a few),
// apart from gpu_util.h's device helpers so that suites with device helpers of their own
// (test_sm80_bwd.cpp) share it.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "fusedattn/error.h"

namespace fusedattn::testing {

// Helpers that may meet a head dim this build did not compile return the reason; the test skips.
using SkipReason = std::optional<std::string>;
#define FUSEDATTN_RUN_OR_SKIP(expr)            \
  do {                                         \
    if (const ::fusedattn::testing::SkipReason why_ = (expr)) GTEST_SKIP() << *why_; \
  } while (0)

// kUnsupported naming head_dim with "compiled" in it: the build lacks that instance (the
// dispatcher's "no compiled ... kernel", or validation's "(compiled: 64, 128)").
inline bool is_missing_instance(const Error& e) {
  return e.code() == ErrorCode::kUnsupported && e.argument() == "head_dim" &&
         std::string(e.what()).find("compiled") != std::string::npos;
}

// Runs fn; returns a skip reason when it reports a head dim missing from this build, rethrows
// anything else.
template <typename Fn>
SkipReason run_unless_missing(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    if (is_missing_instance(e)) return std::string("not compiled in this build: ") + e.what();
    throw;
  }
  return std::nullopt;
}

}  // namespace fusedattn::testing
