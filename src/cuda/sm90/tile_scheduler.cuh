// Which (query block, head, batch) tile a CTA works on next. Tiles are numbered head-major with
// query blocks in reverse: CTAs running at the same time share one head's K/V in L2, and under a
// causal mask (bottom-right aligned, so the last query block sees the most keys) the longest tiles
// of each head come first and the short ones fill the tail.
//
// The producer thread owns the schedule and publishes each tile index to the consumers (see
// kernel.cuh). CTA c starts with tile c; after that the next tile is either
//  - static:  the current one + gridDim.x (round robin; balanced only when tiles are equal), or
//  - dynamic: gridDim.x + atomicAdd(counter, 1), so a CTA that finishes early takes the next
//    tile in line; with the longest-first order this balances causal tiles of unequal length.
#pragma once

namespace fusedattn::cuda::sm90 {

struct WorkTile {
  int index;
  int m_block;
  int first_row;  // m_block * block_m
  int head;
  int batch;
};

class TileScheduler {
 public:
  // counter: zero at launch, or null for the static schedule.
  __device__ TileScheduler(int num_m_blocks, int block_m, int heads, int batch, int* counter)
      : num_m_blocks_(num_m_blocks),
        block_m_(block_m),
        heads_(heads),
        total_(num_m_blocks * heads * batch),
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
    const int head_batch = index / num_m_blocks_;
    const int m_block = num_m_blocks_ - 1 - index % num_m_blocks_;
    return {index, m_block, m_block * block_m_, head_batch % heads_, head_batch / heads_};
  }

 private:
  int num_m_blocks_;
  int block_m_;
  int heads_;
  int total_;
  int* counter_;
};

}  // namespace fusedattn::cuda::sm90
