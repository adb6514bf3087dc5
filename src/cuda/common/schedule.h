// The order in which masked launches hand out their work items, shared by the sm80 forward and
// backward and the sm90 forward.
//
// A launch covers `blocks` row blocks (query blocks in the forward, KV blocks in the backward) of
// each of `pairs` (head, batch) pairs. Under a causal or window mask the items differ in length,
// and CTAs take them roughly in order (the hardware's block dispatch, or the sm90 tile counter),
// so the order decides the tail. Head-major order (every block of pair 0, then pair 1, ...) runs
// the longest items of the last pairs near the end: a simulated list schedule of the FA grid puts
// that 3-14% above the ideal makespan on 132 SMs at 1k-8k. Longest-first over every pair would
// fix the tail but spread the CTAs running together over all pairs, so none share K/V (forward)
// or Q/dO (backward) in L2.
//
// Grouped order: pairs go in groups of 2^shift; inside a group the items are longest-first with
// the pairs fastest (rank 0 of every pair of the group, then rank 1, ...). The group is the
// largest power of two that divides the pair count and whose operands fit a third of the L2, so
// concurrent CTAs still share them; in the same simulation that is within 0-3% of the ideal. A
// power of two that divides the pair count keeps the index arithmetic to one division (the
// kernels recompute it per tile). shift = 0 is head-major order.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <limits>

#include <cuda_runtime.h>

#include "cuda/common/device.h"

namespace fusedattn::cuda {

struct ScheduleOrder {
  int blocks;  // row blocks per pair
  int shift;   // log2 of the pairs per group; the group size divides the pair count
};

struct ScheduledItem {
  int rank;  // 0 = the pair's first item in order (the caller's longest)
  int pair;
};

// Item `index` (0 .. blocks * pairs - 1) of the grouped order.
__host__ __device__ inline ScheduledItem scheduled_item(const ScheduleOrder& order, int index) {
  const int group_items = order.blocks << order.shift;
  const int group = index / group_items;
  const int within = index - group * group_items;
  return {within >> order.shift, (group << order.shift) + (within & ((1 << order.shift) - 1))};
}

#ifdef __CUDACC__
struct GridItem {
  int rank;  // as ScheduledItem::rank
  int y, z;  // the pair as grid coordinates: (head, batch)
};

// The item of the CTA with block index `block` in a grid of x = row block, y = head, z = batch
// (issued x-fastest). kGrouped: its linear block number in the grouped order (a pair is (y, z) =
// (pair % gridDim.y, pair / gridDim.y)); otherwise the grid's own coordinates, i.e. head-major
// order without the index arithmetic.
template <bool kGrouped>
__device__ __forceinline__ GridItem grid_item(int shift, uint3 block) {
  if constexpr (!kGrouped)
    return {static_cast<int>(block.x), static_cast<int>(block.y), static_cast<int>(block.z)};
  const int blocks = static_cast<int>(gridDim.x), heads = static_cast<int>(gridDim.y);
  const int linear = static_cast<int>(block.x) + blocks * (static_cast<int>(block.y) + heads * static_cast<int>(block.z));
  const ScheduledItem item = scheduled_item({blocks, shift}, linear);
  return {item.rank, item.pair % heads, item.pair / heads};
}

// This CTA's item.
template <bool kGrouped>
__device__ __forceinline__ GridItem grid_item(int shift) {
  return grid_item<kGrouped>(shift, blockIdx);
}
#endif

// Fraction of the L2 that a group's operands may fill: the rest holds what other kernels and the
// outputs (O, dQ's accumulator) keep there.
constexpr int kScheduleL2Share = 3;

// log2 of the pairs per group for operands of `bytes_per_pair` each (what the CTAs of one pair
// read repeatedly), the group's operands filling at most 1 / l2_share (>= 1) of the L2.
// FUSEDATTN_SCHEDULE_GROUP=n caps the group at n pairs instead (1: head-major order, as before the
// grouping).
inline int schedule_shift(int64_t bytes_per_pair, int pairs, int l2_share = kScheduleL2Share) {
  int64_t cap = std::numeric_limits<int>::max();
  if (const char* v = std::getenv("FUSEDATTN_SCHEDULE_GROUP"); v != nullptr && std::atoi(v) >= 1) {
    cap = std::atoi(v);
  } else {
    const int l2_bytes = current_device_attribute(cudaDevAttrL2CacheSize);
    cap = int64_t{l2_bytes} / l2_share / (bytes_per_pair > 0 ? bytes_per_pair : 1);
  }
  int shift = 0;
  while (pairs % (2 << shift) == 0 && (int64_t{2} << shift) <= cap) ++shift;
  return shift;
}

}  // namespace fusedattn::cuda
