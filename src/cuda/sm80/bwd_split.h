// The tail split of the sm80 backward's full-mask launches (the plan: cuda/common/tail_split.h).
//
// A full-mask launch is N equal items, one per (KV block, KV head, batch), each of
// L = (query heads per KV head) x (query blocks) main-loop iterations. On the FA grid N is 2048
// (d128) or 4096 (d64) CTAs on 132 SMs: the last of 15.5 / 31.03 rounds leaves most SMs idle.
// Small launches (N below the SM count: batch 1, few heads) leave SMs idle for the whole run.
// Either way the last items are cut into parts, each walking a contiguous share of the item's
// (query head, query block) iterations; their dQ adds are unchanged, their dK/dV go into an fp32
// slot of the workspace, and the last part to finish stores dK/dV from it.
//
// Host and device: the launcher plans with it, the kernel decodes its CTA with it, and the GPU
// tests ask it whether their shapes really split.
#pragma once

#include <cstdint>

#include "cuda/common/env.h"
#include "cuda/common/int_math.h"
#include "cuda/common/tail_split.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// The plan's cost model, in main-loop iterations. Guesses, not measurements: a CTA's prologue
// (K/V load, first Q/dO block) and epilogue (dK/dV conversion and stores) cost about two
// iterations; a part's fp32 dK/dV adds into its slot plus the last part's read-back about two
// more (2 x block_n x head_dim floats through the L2 each way, against one iteration's 4 MMAs
// over the same tile sizes).
constexpr double kBwdItemFixedIterations = 2.0;
constexpr double kBwdPartCombineIterations = 2.0;
constexpr TailCost kBwdTailCost{kBwdItemFixedIterations, kBwdPartCombineIterations};

// Workspace bound on the split items: the plan splits at most N mod P + P items (P = slots =
// SMs x CTAs per SM), so two waves of the device's slots. Every backward row uses more than half
// of an SM's shared memory, so one CTA per SM (plan_bwd_split asserts it for the split row).
constexpr int kBwdSplitMaxWaves = 2;
constexpr int kBwdSplitMaxCtasPerSm = 1;
// Per-item slot bound: dK and dV of block_n x (instance head dim) floats. Instances are 32-wide
// up to d128 (block_n <= 128 there); d192/d256 use block_n = 64, which 128 x the head dim rounded
// to 32 covers as well.
constexpr int64_t kBwdSplitMaxBlockN = 128;
constexpr int64_t kBwdSplitDimGranule = 32;
constexpr int64_t kBwdSplitMinBlockN = 64;  // bounds N from above for the workspace

// The kernel rows (instance head dim, large-memory tile) that split: only the d64 Hopper row. A
// split row's kernel holds the split's bookkeeping (item decode, part start, slot adds), and on
// the d128 Hopper row that cost the unsplit main loop 4%, more than the split wins back. H200,
// fp16 TFLOP/s, main / split row with the split on / off, one call, two repetitions:
//   d128 full 4k 296.0 / 289.0-289.9 / 283.3-283.6, full 16k 311.2 / 305.2 / 297.7-297.8;
//   d64 full 2k 265.2-265.3 / 267.5-267.8 / 262.5-262.6, full 16k 289.0-289.3 / 294.1 / 286.0-286.3.
// The other rows are unmeasured (d32, d96, d192, the A100 rows) or spilled with the split (d256:
// 8/12/16 -> 12/28/28 bytes; the d128 A100 row's sm_90 SASS 0 -> 116), so they keep the plain
// three-dimensional grid and compile as before.
constexpr int kBwdSplitRowHeadDim = 64;
constexpr bool bwd_row_splits(int head_dim, bool large_smem) {
  return head_dim == kBwdSplitRowHeadDim && large_smem;
}

// Full masks only: a causal or window launch has unequal items (the grouped schedule handles its
// tail); deterministic mode needs each dK/dV summed in one order; varlen items differ per
// sequence. Head dims above the split row's never run on it, so their calls get no slots in the
// workspace.
inline bool bwd_may_split(const BwdParams& p) {
  return !p.is_masked() && !p.deterministic && p.cu_seqlens_q == nullptr && p.head_dim <= kBwdSplitRowHeadDim;
}

// FUSEDATTN_BWD_TAIL_SPLIT=0 launches every item whole (an A/B switch).
inline bool bwd_tail_split_enabled() { return env_switch_or("FUSEDATTN_BWD_TAIL_SPLIT", true); }

struct BwdLaunchShape {
  int64_t items;  // CTAs of the unsplit launch: KV blocks x KV heads x batch
  int steps;      // iterations of each: query heads per KV head x query blocks
};

inline BwdLaunchShape bwd_launch_shape(const BwdParams& p, int block_m, int block_n) {
  const int64_t kv_blocks = ceil_div(p.seqlen_k, block_n);
  const int64_t q_blocks = ceil_div(p.seqlen_q, block_m);
  return {kv_blocks * p.heads_kv * p.batch, static_cast<int>(p.heads_q / p.heads_kv * q_blocks)};
}

// The plan of a launch of `shape` (bwd_launch_shape) on `slots` concurrent CTAs: parts == 1 when
// it runs unsplit.
inline TailSplit bwd_tail_split(const BwdParams& p, const BwdLaunchShape& shape, int64_t slots) {
  if (!bwd_may_split(p) || !bwd_tail_split_enabled()) return {shape.items, 1};
  return plan_tail_split(shape.items, shape.steps, slots, kBwdTailCost);
}

// Which item, and which part of it, a CTA of a full-mask launch runs. CTAs [0, whole) are the
// whole items in order; then the parts of each split item, adjacent so they run together.
struct BwdSplitCta {
  int item;
  int part;   // 0 for a whole item
  int parts;  // 1 for a whole item
};

FUSEDATTN_HD BwdSplitCta bwd_split_cta(int cta, int whole, int parts) {
  if (cta < whole) return {cta, 0, 1};
  const int rel = cta - whole;
  return {whole + rel / parts, rel % parts, parts};
}

// Where part `part` of an item starts in its walk of `steps` iterations, head-major over
// `blocks` query blocks per query head: the query head and block offsets of its first iteration,
// and how many iterations it runs.
struct BwdPartStart {
  int head, block;
  int iterations;
};

FUSEDATTN_HD BwdPartStart bwd_part_start(int steps, int blocks, int part, int parts) {
  const int first = part_begin(steps, parts, part);
  return {first / blocks, first % blocks, part_begin(steps, parts, part + 1) - first};
}

}  // namespace fusedattn::cuda::sm80
