// The portable CUDA backward (sm80 kernels, FUSEDATTN_SM90_BWD=0 on Hopper) through the public API
// against the float64 reference (gpu/backward_check.h).
#include <gtest/gtest.h>

#include <string>

#include "gpu/backward_check.h"
#include "gpu/scoped_env.h"

namespace fusedattn::testing {
namespace {

// Every case here runs the portable kernels, also on Hopper, where d64/d128 calls would otherwise
// take the Hopper backward (test_sm90_bwd.cpp).
class Sm80Backward : public ::testing::TestWithParam<DType> {
  const ScopedEnv portable_{"FUSEDATTN_SM90_BWD", "0"};
};

TEST_P(Sm80Backward, RaggedLengths) { check_backward({dense(2, 4, 4, 77, 133, 64), GetParam()}); }
TEST_P(Sm80Backward, CausalMoreQueriesThanKeys) {
  check_backward({causal(dense(1, 2, 2, 200, 130, 128)), GetParam()});  // leading rows see no key
}
TEST_P(Sm80Backward, CausalBhsdLayout) {
  check_backward({causal(dense(1, 2, 2, 130, 300, 128)), GetParam(), Layout::kBHSD});
}
TEST_P(Sm80Backward, SlidingWindow) { check_backward({window(dense(1, 2, 1, 257, 300, 64), 40, 10), GetParam()}); }
TEST_P(Sm80Backward, NarrowWindowFewKeys) { check_backward({window(dense(1, 2, 2, 300, 5, 64), 3, 0), GetParam()}); }
TEST_P(Sm80Backward, GroupedQueryCausal) { check_backward({causal(dense(2, 6, 2, 150, 150, 128)), GetParam()}); }
TEST_P(Sm80Backward, SingleQueryMultiQueryAttention) { check_backward({dense(1, 3, 1, 1, 400, 64), GetParam()}); }
TEST_P(Sm80Backward, VarlenCausalWithEmptySequences) {
  check_backward({varlen(causal(dense(0, 4, 2, 0, 0, 64)), {17, 0, 130, 64}, {40, 33, 130, 1}), GetParam()});
}
TEST_P(Sm80Backward, VarlenWindow) {
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 128), 20, 5), {100, 200, 7}, {250, 90, 7}), GetParam()});
}
TEST_P(Sm80Backward, HeadDimsBelowInstance) {
  for (int d : {40, 112}) check_backward({causal(dense(1, 2, 2, 150, 170, d)), GetParam()});
}
TEST_P(Sm80Backward, LargeLogits) { check_backward({dense(1, 2, 2, 200, 200, 64), GetParam(), Layout::kBSHD, false, 100.0}); }
TEST_P(Sm80Backward, DeterministicCausalGqa) {
  check_backward({causal(dense(2, 4, 2, 300, 400, 128)), GetParam(), Layout::kBSHD, true});
}
TEST_P(Sm80Backward, DeterministicVarlenWindow) {
  check_backward({varlen(window(dense(0, 4, 4, 0, 0, 64), 50, 0), {300, 1, 129}, {310, 64, 100}), GetParam(),
                  Layout::kBSHD, true});
}
// Head dims above 128 split the output columns over warps that share key rows (P^T and dS^T go
// through shared memory): causal GQA with ragged lengths, a window over varlen sequences in
// deterministic mode, and head dims below the instance (zero-filled columns of the last warp).
TEST_P(Sm80Backward, WideHeadCausalGqa) { check_backward({causal(dense(2, 4, 2, 150, 170, 256)), GetParam()}); }
TEST_P(Sm80Backward, WideHeadDeterministicVarlenWindow) {
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 256), 30, 7), {70, 129, 1}, {100, 64, 9}), GetParam(),
                  Layout::kBSHD, true});
}
TEST_P(Sm80Backward, WideHeadDimsBelowInstance) {
  for (int d : {136, 200}) check_backward({dense(1, 2, 1, 97, 130, d), GetParam(), Layout::kBHSD});
}
TEST_P(Sm80Backward, Head192CausalGqa) { check_backward({causal(dense(2, 4, 2, 150, 170, 192)), GetParam()}); }

// The backward's default (A100-sized) tiles, which Hopper replaces with larger-memory ones, checked
// on Hopper too.
TEST_P(Sm80Backward, WideHeadSm80Tiles) {
  const ScopedEnv sm80_tiles("FUSEDATTN_BWD_SM80_TILE", "1");
  check_backward({causal(dense(2, 4, 2, 150, 170, 256)), GetParam()});
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 256), 30, 7), {70, 129, 1}, {100, 64, 9}), GetParam(),
                  Layout::kBSHD, true});
}
// d64 and d128 take other layouts where Hopper's memory allows (column warps, a dQ staging
// buffer of their own); their A100-sized tiles, checked on Hopper too.
TEST_P(Sm80Backward, Sm80TilesHead64And128) {
  const ScopedEnv sm80_tiles("FUSEDATTN_BWD_SM80_TILE", "1");
  check_backward({causal(dense(2, 4, 2, 150, 170, 64)), GetParam()});
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 128), 30, 7), {70, 129, 1}, {100, 64, 9}), GetParam(),
                  Layout::kBSHD, true});
  check_backward({dense(1, 4, 2, 77, 133, 128), GetParam()});
}
// d64's Hopper row keeps each warp's K and V rows in registers (loaded once per CTA; on GPUs
// without its shared memory this checks the A100-sized tile again): causal GQA with ragged lengths
// and several query blocks per CTA, a deterministic varlen window, large logits, head dims below
// the instance. *Sanitizer* in the name: tools/gpu_check.sh runs it under compute-sanitizer.
TEST_P(Sm80Backward, SanitizerKvRegistersHead64) {
  check_backward({causal(dense(2, 4, 2, 300, 410, 64)), GetParam()});
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 64), 50, 0), {300, 1, 129}, {310, 64, 100}), GetParam(),
                  Layout::kBSHD, true});
  check_backward({dense(1, 2, 2, 200, 200, 64), GetParam(), Layout::kBSHD, false, 100.0});
  check_backward({dense(1, 2, 1, 97, 260, 48), GetParam(), Layout::kBHSD});
}
// Small shapes for compute-sanitizer (tools/gpu_check.sh runs tests matching *Sanitizer*): every
// tile family (d32 per-warp dQ adds, d64/d128 dQ staging buffers, d256 column passes).
TEST_P(Sm80Backward, SanitizerSmallRagged) {
  check_backward({causal(dense(2, 2, 1, 77, 133, 64)), GetParam()});
  check_backward({varlen(causal(dense(0, 2, 2, 0, 0, 40)), {17, 0, 70}, {40, 33, 20}), GetParam(), Layout::kBSHD, true});
  check_backward({causal(dense(1, 2, 1, 70, 90, 256)), GetParam()});
  check_backward({window(dense(1, 2, 1, 70, 90, 128), 20, 5), GetParam()});
  check_backward({causal(dense(1, 2, 2, 90, 70, 32)), GetParam()});
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Sm80Backward, ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace fusedattn::testing
