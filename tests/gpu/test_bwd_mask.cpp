// The sm80 backward's block-level mask rules (src/cuda/sm80/bwd_mask.h) against the element-wise
// definition, key_range(), by brute force. Host arithmetic: these run without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "cuda/sm80/bwd_mask.h"

namespace fusedattn::cuda::sm80 {
namespace {

// Some (row, key) pair of the block is masked: a key past len_k, or a row (inside len_q) that
// does not see a key of the block. The definition block_needs_mask() stands for.
bool block_has_masked_pair(const FwdParams& p, int64_t m, int64_t n, int block_m, int block_n, int64_t len_q,
                           int64_t len_k) {
  for (int64_t i = m * block_m; i < (m + 1) * block_m && i < len_q; ++i) {
    const KeyRange r = key_range(p, i, len_q, len_k);
    for (int64_t j = n * block_n; j < (n + 1) * block_n; ++j) {
      if (j >= len_k || j < r.lo || j > r.hi) return true;
    }
  }
  return false;
}

// Random shapes and windows (causal, one-sided, two-sided, none; Sq < Sk, Sq > Sk; lengths off
// the block grid): the per-CTA range of unmasked query blocks is exactly the set of blocks that
// block_needs_mask() clears, and block_needs_mask() agrees with the element-wise rule.
TEST(BwdMask, UnmaskedQueryBlocksMatchTheElementRule) {
  std::mt19937_64 rng(20261121);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  // Block sizes below the kernels' own (64/128) too: the edge cases (a band edge one row before a
  // block boundary) then come up in every few cases rather than one in a hundred.
  constexpr int kBlockSizes[] = {16, 32, 64, 128};
  constexpr int kCases = 2000;
  for (int c = 0; c < kCases; ++c) {
    const int block_m = kBlockSizes[pick(0, 3)], block_n = kBlockSizes[pick(0, 3)];
    const int64_t len_q = pick(1, 700), len_k = pick(1, 700);
    FwdParams p;
    switch (pick(0, 3)) {
      case 0: p.window_left = -1; p.window_right = 0; break;                   // causal
      case 1: p.window_left = pick(0, 300); p.window_right = -1; break;        // left edge only
      case 2: p.window_left = pick(0, 300); p.window_right = pick(0, 300); break;
      default: p.window_left = -1; p.window_right = pick(0, 300); break;       // right edge only
    }
    const int64_t blocks_q = (len_q + block_m - 1) / block_m, blocks_k = (len_k + block_n - 1) / block_n;
    for (int64_t n = 0; n < blocks_k; ++n) {
      const BlockRange unmasked = unmasked_query_blocks(p, true, n, block_m, block_n, len_q, len_k);
      for (int64_t m = 0; m < blocks_q; ++m) {
        const bool needs = block_needs_mask(p, true, m, n, block_m, block_n, len_q, len_k);
        const bool in_range = m >= unmasked.begin && m < unmasked.end;
        ASSERT_EQ(needs, !in_range) << "case " << c << " Sq " << len_q << " Sk " << len_k << " window ("
                                    << p.window_left << ", " << p.window_right << ") blocks " << block_m << "x"
                                    << block_n << " m " << m << " n " << n;
        ASSERT_EQ(needs, block_has_masked_pair(p, m, n, block_m, block_n, len_q, len_k))
            << "case " << c << " m " << m << " n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace fusedattn::cuda::sm80
