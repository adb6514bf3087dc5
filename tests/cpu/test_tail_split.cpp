// The last-wave split plan of full-mask launches (src/cuda/common/tail_split.h): host arithmetic
// that the sm80 backward's launcher uses (the sm90 forward's shares: test_tail_shares.cpp).
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/common/tail_split.h"

namespace fusedattn::cuda {
namespace {

constexpr int64_t kSms = 132;  // H100/H200
constexpr TailCost kCost{1.5, 1.0};

// The FA grid's d128 launches: 2048 items on 132 slots (15.5 rounds). Long items split their
// last wave, and only whole waves run before the split items.
TEST(TailSplit, LongItemsSplitTheLastWave) {
  for (const int steps : {128, 256}) {
    const TailSplit plan = plan_tail_split(2048, steps, kSms, kCost);
    EXPECT_GT(plan.parts, 1) << steps;
    EXPECT_LE(plan.parts, kTailMaxParts);
    EXPECT_EQ(plan.whole % kSms, 0) << "whole items fill whole waves";
    EXPECT_LT(plan.split_items(2048), 2 * kSms);
    EXPECT_EQ(plan.ctas(2048), plan.whole + plan.split_items(2048) * plan.parts);
    const double split = tail_makespan(2048, steps, kSms, plan.split_items(2048), plan.parts, kCost);
    const double unsplit = tail_makespan(2048, steps, kSms, 0, 1, kCost);
    EXPECT_LE(split, unsplit * (1 - kTailMinGain)) << steps;
  }
}

// Nothing to gain: whole waves, items shorter than two minimal parts, fixed costs that eat the
// gain.
TEST(TailSplit, NoSplitWhereItCannotPay) {
  EXPECT_EQ(plan_tail_split(4 * kSms, 256, kSms, kCost).parts, 1);
  EXPECT_EQ(plan_tail_split(2048, 2 * kTailMinPartSteps - 1, kSms, kCost).parts, 1);
  EXPECT_EQ(plan_tail_split(2048, 128, kSms, {200.0, 0.0}).parts, 1);
  EXPECT_EQ(plan_tail_split(0, 128, kSms, kCost).parts, 1);
  const TailSplit none = plan_tail_split(4 * kSms, 256, kSms, kCost);
  EXPECT_EQ(none.whole, 4 * kSms);
  EXPECT_EQ(none.ctas(4 * kSms), 4 * kSms);
}

// Fewer items than slots: every item is in the split (parts fill the idle slots).
TEST(TailSplit, FewItemsAllSplit) {
  const TailSplit plan = plan_tail_split(100, 128, kSms, kCost);
  EXPECT_GT(plan.parts, 1);
  EXPECT_EQ(plan.whole, 0);
}

// Parts tile an item's steps exactly, near-equal (lengths differ by at most one).
TEST(TailSplit, PartsCoverEveryStepOnce) {
  for (const int steps : {8, 17, 128, 255})
    for (int parts = 1; parts <= kTailMaxParts; ++parts) {
      EXPECT_EQ(part_begin(steps, parts, 0), 0);
      EXPECT_EQ(part_begin(steps, parts, parts), steps);
      for (int p = 0; p < parts; ++p) {
        const int len = part_begin(steps, parts, p + 1) - part_begin(steps, parts, p);
        EXPECT_GE(len, steps / parts);
        EXPECT_LE(len, (steps + parts - 1) / parts);
      }
    }
}

}  // namespace
}  // namespace fusedattn::cuda
