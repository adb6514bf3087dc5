// append_kv on the CPU backend (fusedattn/kv_cache.h): the caches and statuses its rules give,
// per-sequence and paged, with sequences past their caches and table entries of no page left
// unwritten; and every malformed argument rejected by name.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "fusedattn/kv_cache.h"
#include "reference/append_case.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

void expect_as_the_rules_say(AppendCase c) {
  std::vector<float> k_want, v_want;
  std::vector<int32_t> status_want, status;
  c.expected(k_want, v_want, status_want);
  append_kv(c.args(status));
  EXPECT_EQ(status, status_want);
  EXPECT_TRUE(c.k_cache == k_want) << "k_cache";
  EXPECT_TRUE(c.v_cache == v_want) << "v_cache";
}

TEST(CpuAppendKv, PerSequenceCaches) {
  std::mt19937_64 rng = fresh_rng();
  // Lengths: a few, none, a full cache after the new tokens, past it, negative.
  expect_as_the_rules_say(AppendCase({3, 0, 38, 39, -1}, 2, 2, 24, 40, 1, false, rng));
  expect_as_the_rules_say(AppendCase({7}, 1, 1, 8, 8, 1, false, rng));
}

TEST(CpuAppendKv, PagedCaches) {
  std::mt19937_64 rng = fresh_rng();
  AppendCase c({5, 14, 0, 30, 31}, 3, 2, 16, 8, 4, true, rng);  // 14: the new tokens cross a page
  c.table[0 * 4 + 1] = -1;  // sequence 0 lands in its page 0 only: unaffected
  c.table[1 * 4 + 2] = static_cast<int32_t>(c.num_pages);  // sequence 1's tokens 2: page 2, no page of the pool
  expect_as_the_rules_say(c);
}

TEST(CpuAppendKv, NoNewTokensWritesOnlyTheStatus) {
  std::mt19937_64 rng = fresh_rng();
  expect_as_the_rules_say(AppendCase({0, 40, 41}, 0, 2, 8, 40, 1, false, rng));
}

TEST(CpuAppendKv, RejectsMalformedArgumentsByName) {
  std::mt19937_64 rng = fresh_rng();
  AppendCase c({1, 2}, 1, 2, 8, 16, 2, true, rng);
  std::vector<int32_t> status;
  const AppendKvArgs a = c.args(status);
  std::vector<int32_t> wide(4);
  // Each malformed variant of the arguments, and the argument its error must name.
  const std::vector<std::pair<std::function<void(AppendKvArgs&)>, const char*>> cases = {
      {[](AppendKvArgs& x) { x.k.dtype = DType::kFloat16; }, "k"},
      {[](AppendKvArgs& x) { x.v_cache.shape[1] = 8; }, "v_cache"},
      {[](AppendKvArgs& x) { x.k.shape[3] = x.v.shape[3] = 4; }, "k"},  // alike, not the caches' head dim
      {[&](AppendKvArgs& x) { x.status = TensorView::contiguous(wide.data(), DType::kInt32, {4}); }, "status"},
      {[](AppendKvArgs& x) { x.cache_seqlens.dtype = DType::kFloat32; }, "cache_seqlens"},
      {[](AppendKvArgs& x) { x.block_table.shape[0] = 1; }, "block_table"},
      {[](AppendKvArgs& x) { x.block_table.rank = 9; }, "block_table"},  // its message names the rank, reads no size
      {[](AppendKvArgs& x) { x.block_table = {}; }, "k_cache"},  // per-sequence caches: 6 of them for 2 sequences
      {[](AppendKvArgs& x) { x.v_cache.stride[2] = x.v_cache.shape[3] / 2; }, "v_cache"},  // heads overlap
      // A written tensor over another tensor's memory (each view inside the other's buffer, so that
      // nothing else can meet it).
      {[](AppendKvArgs& x) { x.v_cache.data = x.k_cache.data; }, "v_cache"},
      {[](AppendKvArgs& x) { x.k.data = x.k_cache.data; }, "k_cache"},
      {[](AppendKvArgs& x) { x.status.data = x.cache_seqlens.data; }, "status"},
      {[](AppendKvArgs& x) { x.status.data = x.block_table.data; }, "status"},
  };
  for (const auto& [make_bad, name] : cases) {
    AppendKvArgs bad = a;
    make_bad(bad);
    try {
      append_kv(bad);
      ADD_FAILURE() << "accepted a malformed " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), name) << e.what();
    }
  }
}

}  // namespace
}  // namespace fusedattn::testing
