// The rules by which the CUDA kernels read a column mask's per-block summary
// (src/cuda/common/column_summary.h), against the masks' definition by brute force: a block the
// summary calls hidden hides every (row, key) pair, one it calls untouched hides none, and the rows
// outside column_seen_rows() are hidden from every key. Host arithmetic: these run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/column_summary.h"

namespace fusedattn::cuda {
namespace {

// Each key's bounds: [s0, e0) and [s1, e1) of hidden rows.
struct Key {
  int s0, e0, s1, e1;
  bool hides(int row) const { return (row >= s0 && row < e0) || (row >= s1 && row < e1); }
};

// The summary of keys as column_summary.cu writes it: per interval, (least start, greatest start,
// least end, greatest end), an empty interval counting as start INT_MAX, end INT_MIN.
std::vector<int4> summarise(const std::vector<Key>& keys) {
  std::vector<int4> out(kColumnSummaryIntervals, int4{INT_MAX, INT_MIN, INT_MAX, INT_MIN});
  for (const Key& k : keys)
    for (int i = 0; i < kColumnSummaryIntervals; ++i) {
      int s = i == 0 ? k.s0 : k.s1, e = i == 0 ? k.e0 : k.e1;
      if (s >= e) s = INT_MAX, e = INT_MIN;
      out[i] = {std::min(out[i].x, s), std::max(out[i].y, s), std::min(out[i].z, e), std::max(out[i].w, e)};
    }
  return out;
}

// Random keys of a block: documents (one interval reaching the end), prefixes, windows as two
// intervals, empty intervals and bounds outside [0, len_q); one kind for the whole block, or (one
// block in four) a kind per key.
std::vector<Key> random_block(std::mt19937_64& rng, int keys, int len_q) {
  std::uniform_int_distribution<int> row(-8, len_q + 8), kind(0, 4);
  const int doc_end = std::uniform_int_distribution<int>(0, len_q)(rng);
  const int block_kind = kind(rng);
  const bool mixed = std::uniform_int_distribution<int>(0, 3)(rng) == 0;
  std::vector<Key> out;
  for (int j = 0; j < keys; ++j) {
    switch (mixed ? kind(rng) : block_kind) {
      case 0: out.push_back({doc_end, len_q, 0, 0}); break;                        // documents
      case 1: out.push_back({0, std::max(0, doc_end - j), 0, 0}); break;           // a prefix hidden
      case 2: out.push_back({0, doc_end / 2, doc_end + j % 5, len_q}); break;      // both ends
      case 3: out.push_back({row(rng), row(rng), row(rng), row(rng)}); break;      // anything
      default: out.push_back({5, 5, len_q, 0}); break;                             // nothing hidden
    }
  }
  return out;
}

TEST(ColumnRules, CoverAgreesWithTheKeys) {
  std::mt19937_64 rng(20261130);
  int hidden_blocks = 0, untouched_blocks = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int len_q = std::uniform_int_distribution<int>(1, 300)(rng);
    const int keys = std::uniform_int_distribution<int>(1, 64)(rng);
    const std::vector<Key> block = random_block(rng, keys, len_q);
    const std::vector<int4> summary = summarise(block);
    const int r0 = std::uniform_int_distribution<int>(0, len_q - 1)(rng);
    const int r1 = std::uniform_int_distribution<int>(r0 + 1, len_q)(rng);
    const ColumnCover cover = column_cover(summary.data(), r0, r1);
    bool all = true, none = true;
    for (const Key& k : block)
      for (int r = r0; r < r1; ++r) (k.hides(r) ? none : all) = false;
    if (!cover.seen) {
      EXPECT_TRUE(all) << "trial " << trial << ": a block called hidden shows a pair";
      ++hidden_blocks;
    }
    if (!cover.cut) {
      EXPECT_TRUE(none) << "trial " << trial << ": a block called untouched hides a pair";
      ++untouched_blocks;
    }
  }
  // The rules must decide something, or the kernels would skip nothing.
  EXPECT_GT(hidden_blocks, 100);
  EXPECT_GT(untouched_blocks, 100);
}

TEST(ColumnRules, RowsOutsideTheSeenSpanAreHiddenFromEveryKey) {
  std::mt19937_64 rng(20261201);
  int narrowed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int len_q = std::uniform_int_distribution<int>(1, 300)(rng);
    const int keys = std::uniform_int_distribution<int>(1, 64)(rng);
    const std::vector<Key> block = random_block(rng, keys, len_q);
    const RowSpan seen = column_seen_rows(summarise(block).data(), len_q);
    if (seen.first > 0 || seen.end < len_q) ++narrowed;
    for (int r = 0; r < len_q; ++r) {
      if (seen.first < seen.end && r >= seen.first && r < seen.end) continue;
      for (const Key& k : block) ASSERT_TRUE(k.hides(r)) << "trial " << trial << ": row " << r << " is seen";
    }
  }
  EXPECT_GT(narrowed, 300);
}

// Causal documents: a key block inside one document is seen by exactly the rows before its end.
TEST(ColumnRules, DocumentsNarrowToTheirRows) {
  const int len_q = 1000, doc_end = 640;
  const std::vector<Key> block(64, Key{doc_end, len_q, 0, 0});
  const RowSpan seen = column_seen_rows(summarise(block).data(), len_q);
  EXPECT_EQ(seen.first, 0);
  EXPECT_EQ(seen.end, doc_end);
  EXPECT_FALSE(column_cover(summarise(block).data(), doc_end, len_q).seen);
  EXPECT_FALSE(column_cover(summarise(block).data(), 0, doc_end).cut);
  EXPECT_TRUE(column_cover(summarise(block).data(), doc_end - 1, doc_end + 1).cut);
}

// FragmentKeys::count_before, the keys of a fragment before a run's end, against counting them
// one by one: the forward's layout (pairs of adjacent keys every 8) and the backward's (keys 8
// apart every 16), from every offset a lane has, at every end in and around the block.
template <int kPerStep, int kStep, int kSpacing>
void expect_counts_by_brute_force(int keys_per_thread) {
  constexpr int kBlockFirst = 256;
  for (int offset = 0; offset < kStep; ++offset) {
    const FragmentKeys<kPerStep, kStep, kSpacing> keys{kBlockFirst, offset};
    for (int end = -4; end <= kStep * keys_per_thread + 4; ++end) {
      int below = 0;
      for (int k = 0; k < keys_per_thread; ++k) below += keys.key(k) < kBlockFirst + end;
      const int counted = keys.count_before(end);
      EXPECT_EQ(counted < keys_per_thread ? counted : keys_per_thread, below) << "offset " << offset << ", end " << end;
    }
  }
}

TEST(ColumnRules, RunsMapOntoFragmentKeys) {
  expect_counts_by_brute_force<2, 8, 1>(32);   // sm90 / sm80 forward: key0 + 8 (k / 2) + k % 2
  expect_counts_by_brute_force<2, 16, 8>(4);   // sm80 backward: key0 + 16 (k / 2) + 8 (k % 2)
}

// A run's end comes back from its byte of the header.
TEST(ColumnRules, RunEndsComeBackFromTheHeader) {
  const int ends[kColumnRunsMax] = {1, 16, 17, 64, 100, 127, 200, kColumnSummaryMaxBlockKeys};
  unsigned words[2] = {0, 0};
  for (int r = 0; r < kColumnRunsMax; ++r)
    words[r / kColumnRunEndsPerWord] |= static_cast<unsigned>(ends[r])
                                        << (r % kColumnRunEndsPerWord * kColumnRunEndBits);
  const int4 header{kColumnRunsMax, static_cast<int>(words[0]), static_cast<int>(words[1]), 0};
  for (int r = 0; r < kColumnRunsMax; ++r) EXPECT_EQ(column_run_end(header, r), ends[r]) << "run " << r;
}

}  // namespace
}  // namespace fusedattn::cuda
