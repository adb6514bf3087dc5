// The sm80 backward's tail-split bookkeeping (src/cuda/sm80/bwd_split.h), host arithmetic the
// kernel runs too: which item and part a CTA takes, and where a part starts its walk.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "cuda/sm80/bwd_split.h"

namespace fusedattn::cuda::sm80 {
namespace {

constexpr int64_t kSms = 132;  // H100/H200

// Every (item, part) of the plan is taken by exactly one CTA, whole items in order first and the
// parts of a split item adjacent.
TEST(BwdSplit, CtasCoverEveryItemPartOnce) {
  for (const auto& [items, steps] : std::vector<std::pair<int64_t, int>>{{2048, 256}, {4096, 128}, {16, 16}, {18, 8}}) {
    const TailSplit plan = plan_tail_split(items, steps, kSms, kBwdTailCost);
    ASSERT_GT(plan.parts, 1) << items << " items of " << steps << " steps";
    std::set<std::pair<int, int>> seen;
    int previous_item = -1;
    for (int cta = 0; cta < plan.ctas(items); ++cta) {
      const BwdSplitCta at = bwd_split_cta(cta, static_cast<int>(plan.whole), plan.parts);
      EXPECT_GE(at.item, previous_item) << "items in order";
      previous_item = at.item;
      EXPECT_EQ(at.parts, at.item < plan.whole ? 1 : plan.parts);
      EXPECT_TRUE(seen.insert({at.item, at.part}).second) << "CTA " << cta << " repeats a part";
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), plan.whole + plan.split_items(items) * plan.parts);
    EXPECT_EQ(seen.rbegin()->first, items - 1);
  }
}

// The parts' walks, each from its start through the cursor's head-major order, visit every
// (query head, query block) of the item once and in order.
TEST(BwdSplit, PartsWalkTheItemOnce) {
  for (const int heads : {1, 2, 3}) {
    for (const int blocks : {1, 7, 16}) {
      const int steps = heads * blocks;
      for (int parts = 1; parts <= kTailMaxParts && steps / parts >= 1; ++parts) {
        int next = 0;  // the iteration the next part must start at
        for (int part = 0; part < parts; ++part) {
          const BwdPartStart start = bwd_part_start(steps, blocks, part, parts);
          int head = start.head, block = start.block;
          for (int i = 0; i < start.iterations; ++i, ++next) {
            EXPECT_EQ(head * blocks + block, next) << heads << "x" << blocks << " part " << part << "/" << parts;
            if (++block == blocks) ++head, block = 0;
          }
        }
        EXPECT_EQ(next, steps);
      }
    }
  }
}

// Calls that may split: full masks that are neither deterministic nor varlen, with a head dim
// that runs on the split row (d64) or a smaller instance.
TEST(BwdSplit, OnlyFullMaskLaunchesMaySplit) {
  BwdParams p;
  p.batch = 1, p.heads_q = 2, p.heads_kv = 2, p.head_dim = 64, p.seqlen_q = 1024, p.seqlen_k = 1024;
  EXPECT_TRUE(bwd_may_split(p));
  const BwdLaunchShape shape = bwd_launch_shape(p, 64, 128);  // the same for every variant below
  EXPECT_GT(bwd_tail_split(p, shape, kSms).parts, 1);
  BwdParams causal = p;
  causal.window_right = 0;
  EXPECT_EQ(bwd_tail_split(causal, shape, kSms).parts, 1);
  BwdParams deterministic = p;
  deterministic.deterministic = true;
  EXPECT_EQ(bwd_tail_split(deterministic, shape, kSms).parts, 1);
  const int32_t offsets[] = {0, 1024};
  BwdParams varlen = p;
  varlen.cu_seqlens_q = offsets, varlen.cu_seqlens_k = offsets;
  EXPECT_EQ(bwd_tail_split(varlen, shape, kSms).parts, 1);
  BwdParams wide = p;
  wide.head_dim = 72;
  EXPECT_FALSE(bwd_may_split(wide));
}

}  // namespace
}  // namespace fusedattn::cuda::sm80
