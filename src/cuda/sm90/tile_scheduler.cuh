// Which (query block, head, batch) tile a CTA works on next. Tiles are numbered in the grouped
// order of cuda/common/schedule.h with query blocks in reverse: under a causal mask (bottom-right
// aligned, so the last query block sees the most keys) the longest tiles of a group of heads come
// first and the short ones fill the tail, while the CTAs running together share the group's K/V
// in L2. A group of one head (full masks: equal tiles) is head-major order.
//
// The producer thread owns the schedule and announces each tile to the consumers (see
// tile_announcement.cuh). CTA c starts with tile c; after that the next tile is either
//  - static:  the current one + gridDim.x (round robin; balanced only when tiles are equal), or
//  - dynamic: gridDim.x + atomicAdd(counter, 1), so a CTA that finishes early takes the next
//    tile in line; with the longest-first order this balances causal tiles of unequal length.
// What the CTAs take are work items: tiles, or with a split last wave (kernel_params.h,
// SplitParams) the parts of the last tiles, which come after every whole tile.
#pragma once

#include "cuda/common/schedule.h"
#include "cuda/sm90/kernel_params.h"

namespace fusedattn::cuda::sm90 {

constexpr int kWholeTile = -1;  // WorkTile::part of a tile run whole

struct WorkTile {
  int index;      // the work item
  int first_row;  // the query block's first row
  int head;
  int batch;
  int part;  // kWholeTile, or which part of a split tile
  int slot;  // a split tile's workspace slot (its position among the split tiles)
};

class TileScheduler {
 public:
  // counter: zero at launch, or null for the static schedule.
  __device__ TileScheduler(int num_m_blocks, int block_m, int heads, int group_shift, const SplitParams& split,
                           int* counter)
      : order_{num_m_blocks, group_shift},
        block_m_(block_m),
        heads_(heads),
        total_(split.items),
        whole_(split.whole),
        parts_(split.parts),
        counter_(counter) {}

  __device__ WorkTile first() const { return tile_at(static_cast<int>(blockIdx.x)); }

  // Called once per tile by the producer thread, including once past the last one.
  __device__ WorkTile next(const WorkTile& t) const {
    const int grid = static_cast<int>(gridDim.x);
    if (counter_ == nullptr) return tile_at(t.index + grid);
    const int taken = atomicAdd(counter_, 1);
    // Every CTA ends with exactly one fetch past the last tile, so a launch makes
    // (total - grid) + grid = total fetches: the one that returns total - 1 is the launch's last,
    // and it leaves the counter at zero for the next launch on the stream.
    if (taken == total_ - 1) atomicExch(counter_, 0);
    return tile_at(grid + taken);
  }

  __device__ bool is_valid(const WorkTile& t) const { return t.index < total_; }

  __device__ WorkTile tile_at(int index) const {
    int tile = index, part = kWholeTile, slot = 0;
    if (index >= whole_) {
      slot = (index - whole_) / parts_;
      part = index - whole_ - slot * parts_;
      tile = whole_ + slot;
    }
    const ScheduledItem item = scheduled_item(order_, tile);
    const int m_block = order_.blocks - 1 - item.rank;
    return {index, m_block * block_m_, item.pair % heads_, item.pair / heads_, part, slot};
  }

 private:
  ScheduleOrder order_;
  int block_m_;
  int heads_;
  int total_;  // work items
  int whole_;  // items before whole_ are whole tiles
  int parts_;
  int* counter_;
};

}  // namespace fusedattn::cuda::sm90
