// Which (query block, head, batch) tile a CTA works on next. A static persistent schedule: the
// grid has at most one CTA per SM and CTA c takes tiles c, c + grid, c + 2 grid, ...
// Tiles are numbered head-major with query blocks in reverse: CTAs running at the same time share
// one head's K/V in L2, and under a causal mask (bottom-right aligned, so the last query block
// sees the most keys) the longest tiles of each head come first and the short ones fill the tail.
#pragma once

namespace fusedattn::cuda::sm90 {

struct WorkTile {
  int index;
  int m_block;
  int head;
  int batch;
};

class StaticTileScheduler {
 public:
  __device__ StaticTileScheduler(int num_m_blocks, int heads, int batch)
      : num_m_blocks_(num_m_blocks), heads_(heads), total_(num_m_blocks * heads * batch) {}

  __device__ WorkTile get_initial_work() const { return tile_at(static_cast<int>(blockIdx.x)); }
  __device__ WorkTile get_next_work(const WorkTile& t) const { return tile_at(t.index + static_cast<int>(gridDim.x)); }
  __device__ bool is_valid(const WorkTile& t) const { return t.index < total_; }

 private:
  __device__ WorkTile tile_at(int index) const {
    const int head_batch = index / num_m_blocks_;
    const int m_block = num_m_blocks_ - 1 - index % num_m_blocks_;
    return {index, m_block, head_batch % heads_, head_batch / heads_};
  }
  int num_m_blocks_;
  int heads_;
  int total_;
};

}  // namespace fusedattn::cuda::sm90
