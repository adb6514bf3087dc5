// The grouped work order of masked launches (src/cuda/common/schedule.h). Host arithmetic: these
// run without a GPU, except the group choice, which reads the device's L2 size.
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "cuda/common/schedule.h"
#include "gpu_util.h"
#include "scoped_env.h"

namespace fusedattn::cuda {
namespace {

// Every item appears exactly once, each pair's ranks come in increasing order, and the CTAs of a
// group take rank r of all its pairs before rank r + 1 of any.
TEST(Schedule, GroupedOrderIsAPermutationLongestFirstPerGroup) {
  for (const int blocks : {1, 3, 8, 33}) {
    for (const int pairs : {1, 2, 12, 64}) {
      for (int shift = 0; pairs % (1 << shift) == 0 && (1 << shift) <= pairs; ++shift) {
        const int group = 1 << shift;
        std::set<std::pair<int, int>> seen;
        std::vector<int> next_rank(pairs, 0);
        for (int index = 0; index < blocks * pairs; ++index) {
          const ScheduledItem item = scheduled_item({blocks, shift}, index);
          ASSERT_GE(item.pair, 0);
          ASSERT_LT(item.pair, pairs);
          ASSERT_EQ(item.rank, next_rank[item.pair]) << "blocks " << blocks << " pairs " << pairs << " shift " << shift;
          ++next_rank[item.pair];
          seen.insert({item.rank, item.pair});
          ASSERT_EQ(item.pair / group, index / (group * blocks)) << "a pair outside its group";
          ASSERT_EQ(item.rank, index % (group * blocks) / group) << "not rank-major inside the group";
        }
        EXPECT_EQ(static_cast<int>(seen.size()), blocks * pairs);
      }
    }
  }
}

TEST(Schedule, ShiftZeroIsHeadMajor) {
  constexpr int kBlocks = 5, kPairs = 7;
  for (int index = 0; index < kBlocks * kPairs; ++index) {
    const ScheduledItem item = scheduled_item({kBlocks, 0}, index);
    EXPECT_EQ(item.pair, index / kBlocks);
    EXPECT_EQ(item.rank, index % kBlocks);
  }
}

// The group divides the pair count, is a power of two, and FUSEDATTN_SCHEDULE_GROUP caps it.
TEST(Schedule, GroupChoice) {
  FUSEDATTN_REQUIRE_GPU();
  constexpr int64_t kSmallOperands = 1024;  // every group fits the L2
  EXPECT_EQ(schedule_shift(kSmallOperands, 48), 4);  // 16 divides 48, 32 does not
  EXPECT_EQ(schedule_shift(kSmallOperands, 1), 0);
  EXPECT_EQ(schedule_shift(int64_t{1} << 40, 64), 0);  // one pair already overflows the L2
  // A larger share halves the cap: with operands of 1 / 100 of the L2 per pair, a third of it
  // holds 33 pairs (group 32), a sixth 16.
  const int64_t l2_bytes = current_device_attribute(cudaDevAttrL2CacheSize);
  EXPECT_EQ(schedule_shift(l2_bytes / 100, 64), 5);
  EXPECT_EQ(schedule_shift(l2_bytes / 100, 64, 2 * kScheduleL2Share), 4);
  const ::fusedattn::testing::ScopedEnv capped("FUSEDATTN_SCHEDULE_GROUP", "4");
  EXPECT_EQ(schedule_shift(kSmallOperands, 64), 2);
  const ::fusedattn::testing::ScopedEnv head_major("FUSEDATTN_SCHEDULE_GROUP", "1");
  EXPECT_EQ(schedule_shift(kSmallOperands, 64), 0);
}

}  // namespace
}  // namespace fusedattn::cuda
