// The balanced shares of a full-mask forward launch's last items (src/cuda/common/tail_shares.h):
// host arithmetic that the sm90 launcher plans with and its scheduler decodes shares with.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/common/tail_shares.h"

namespace fusedattn::cuda {
namespace {

constexpr int64_t kSms = 132;  // H100/H200
constexpr TailCost kCost{1.5, 3.0};

// Walks every share as the scheduler does (segment after segment) and checks that the segments
// tile each item's steps exactly once, in part order, as many as the item's parts_of.
void expect_segments_cover(const TailShares& s) {
  SCOPED_TRACE(::testing::Message() << s.tiles << " items of " << s.steps << " steps, " << s.shares << " shares");
  std::vector<int> next_step(static_cast<size_t>(s.tiles), 0), next_part(static_cast<size_t>(s.tiles), 0);
  int max_parts = 0;
  double longest = 0.0;  // the plan's figure, from the walk: steps plus fixed costs per segment
  for (int j = 0; j < s.shares; ++j) {
    const int end = s.share_begin(j + 1);
    ASSERT_LT(s.share_begin(j), end) << "share " << j << " is empty";
    int segments = 0;
    for (int x = s.share_begin(j); x < end; ++segments) {
      const TailSegment seg = s.segment_at(x, end);
      ASSERT_GE(seg.item, 0);
      ASSERT_LT(seg.item, s.tiles);
      const size_t i = static_cast<size_t>(seg.item);
      EXPECT_EQ(seg.step_lo, next_step[i]) << "item " << i;
      EXPECT_GT(seg.step_hi, seg.step_lo);
      EXPECT_LE(seg.step_hi, s.steps);
      EXPECT_EQ(seg.part, next_part[i]) << "item " << i;
      EXPECT_LT(seg.part, s.parts_of(seg.item));
      next_step[i] = seg.step_hi;
      ++next_part[i];
      EXPECT_GT(seg.end, x);
      x = seg.end;
    }
    const double cost = (end - s.share_begin(j)) + segments * (kCost.item_steps + kCost.part_steps);
    longest = cost > longest ? cost : longest;
  }
  for (int i = 0; i < s.tiles; ++i) {
    EXPECT_EQ(next_step[static_cast<size_t>(i)], s.steps) << "item " << i << " covered";
    EXPECT_EQ(next_part[static_cast<size_t>(i)], s.parts_of(i)) << "item " << i;
    max_parts = s.parts_of(i) > max_parts ? s.parts_of(i) : max_parts;
  }
  EXPECT_EQ(max_parts, s.max_parts);
  EXPECT_EQ(tail_share_costs(s, kCost).max_parts, s.max_parts);
  EXPECT_DOUBLE_EQ(tail_share_costs(s, kCost).longest, longest);
}

TEST(TailShares, SegmentsCoverEveryStepOnce) {
  for (const int64_t tiles : {1, 2, 7, 16, 68, 100})
    for (const int steps : {1, 4, 9, 13, 64, 103})
      for (const int64_t shares : {int64_t{2}, tiles, 3 * tiles, kSms, int64_t{7}}) {
        if (shares < 2 || shares > tiles * steps) continue;
        expect_segments_cover(cut_tail(tiles + 5 * kSms, tiles, steps, static_cast<int>(shares)));
      }
}

// S = T x parts is tail_split.h's plan: every share one equal part of one item.
TEST(TailShares, EqualPartsAreOneSegmentEach) {
  for (const int parts : {2, 3, 5, 8}) {
    const TailShares s = cut_tail(100, 100, 37, 100 * parts);
    EXPECT_EQ(s.max_parts, parts);
    for (int j = 0; j < s.shares; ++j) {
      const TailSegment seg = s.segment_at(s.share_begin(j), s.share_begin(j + 1));
      EXPECT_EQ(seg.end, s.share_begin(j + 1)) << "one segment";
      EXPECT_EQ(seg.step_lo, part_begin(37, parts, seg.part));
      EXPECT_EQ(seg.step_hi, part_begin(37, parts, seg.part + 1));
    }
  }
}

// The FA grid's d256 full 8k: 1024 tiles of 103 80-key blocks on 132 SMs leave 100 tiles for the
// eighth round. No number of equal parts fills 132 slots with them; 132 shares of 78 steps do.
TEST(TailShares, BalancedSharesFillTheLastRound) {
  const TailShares s = plan_tail_shares(1024, 103, kSms, kCost);
  ASSERT_TRUE(s.split());
  EXPECT_EQ(s.shares, kSms);
  EXPECT_EQ(s.tiles, 1024 % kSms);
  EXPECT_EQ(s.whole % kSms, 0) << "whole items fill whole waves";
  EXPECT_EQ(s.items(), s.whole + kSms);
  EXPECT_LE(s.max_parts, 3);
  const double unsplit = tail_shares_makespan(1024, 103, kSms, TailShares::unsplit(1024, 103), kCost);
  EXPECT_FALSE(can_cut_tail(1024, 100, 1 << 20, kSms)) << "the decode's products must fit 32 bits";
  EXPECT_LE(tail_shares_makespan(1024, 103, kSms, s, kCost), unsplit * (1 - kTailMinGain));
  expect_segments_cover(s);
}

// Nothing to gain: whole waves, short items, fixed costs that eat the gain, nothing to run.
TEST(TailShares, NoSplitWhereItCannotPay) {
  EXPECT_FALSE(plan_tail_shares(4 * kSms, 256, kSms, kCost).split());
  EXPECT_EQ(plan_tail_shares(4 * kSms, 256, kSms, kCost).items(), 4 * kSms);
  EXPECT_FALSE(plan_tail_shares(2048, 2 * kTailMinPartSteps - 1, kSms, kCost).split());
  EXPECT_FALSE(plan_tail_shares(2048, 128, kSms, {200.0, 0.0}).split());
  EXPECT_FALSE(plan_tail_shares(0, 128, kSms, kCost).split());
  EXPECT_FALSE(plan_tail_shares(100, 0, kSms, kCost).split());
}

// Fewer items than slots: all of them are cut, no item into more than kTailMaxParts parts.
TEST(TailShares, FewItemsAllSplit) {
  for (const int64_t items : {1, 5, 32, 100}) {
    const TailShares s = plan_tail_shares(items, 128, kSms, kCost);
    ASSERT_TRUE(s.split()) << items;
    EXPECT_EQ(s.whole, 0);
    EXPECT_LE(s.max_parts, kTailMaxParts);
    EXPECT_LE(s.shares, kSms) << "one round";
    expect_segments_cover(s);
  }
}

}  // namespace
}  // namespace fusedattn::cuda
