// What the producer announces ahead of each tile's Q: the tile, its visible KV blocks and, per
// consumer warpgroup, the blocks its 64-row slice needs no element-wise mask on. The producer
// thread works these out once (the schedule's divisions, key_range's 64-bit arithmetic) instead
// of every consumer thread repeating them per tile; the consumers read a few words back. A slot
// has its own full/empty barriers (SharedStorage::tile_full, tile_empty), so the consumers read
// the next tile and set it up while its Q is still loading.
//
// Both sides use atomics on the words: tile_full's mbarrier already orders them, but
// compute-sanitizer's racecheck does not follow that chain and flags plain accesses, while
// atomics are never a data race.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/tile_config.h"
#include "cuda/sm90/tile_scheduler.cuh"

namespace fusedattn::cuda::sm90 {

constexpr int kNoTile = -1;

struct TileAnnouncement {
  int index;  // kNoTile: no more tiles, the CTA is done
  int first_row, head, batch;
  int part, slot;                               // WorkTile's: which part of a split tile, its workspace slot
  int q_start, len_q, len_k;                    // WorkTile's: the tile's sequence (its K/V rows are the producer's)
  KVBlockRange blocks;                          // visible KV blocks of the tile, or of the part
  KVBlockRange uncut[kMaxConsumerWarpgroups];  // per consumer warpgroup's slice, see MaskedSlice
  // Per consumer warpgroup, the blocks (of `blocks`) its slice's rows see at all, which it alone
  // works on where TileMask::kSlicesSkipBlocks (else `blocks`).
  KVBlockRange visible[kMaxConsumerWarpgroups];
  // Bit wg: warpgroup wg's first visible block is narrow (TileMask::kNarrowsFirstBlock).
  unsigned narrow_first;
};
constexpr int kAnnouncementWords = static_cast<int>(sizeof(TileAnnouncement) / sizeof(int));
static_assert(sizeof(TileAnnouncement) == kAnnouncementWords * sizeof(int), "announced one word per lane");
static_assert(kAnnouncementWords <= 32, "a warp reads the announcement with one word per lane");

// A consumer warpgroup's view of an announcement: the tile and its own slice's facts.
struct AnnouncedTile {
  WorkTile tile;
  KVBlockRange blocks;
  KVBlockRange visible;  // this warpgroup's, within blocks
  MaskedSlice slice;
  bool narrow_first;  // the highest block of `visible` is narrow for this slice
  __device__ __forceinline__ bool valid() const { return tile.index != kNoTile; }
};

// Producer thread: the announcement of tile t (kNoTile when !valid) for a tile shape of
// consumer_warpgroups 64-row slices; a part of a split tile gets its steps [step_lo, step_hi) of
// the plan's `steps` per tile, scaled onto the tile's own KV blocks (the same blocks for a dense
// batch; a variable-length one's tiles differ, the plan models the longest). The cut blocks stay
// the tile's: the sequence end still cuts the last block, which the tile's last part runs. mask:
// the tile's (its sequence's lengths). narrow: whether slices may take their first block narrow
// (Features::narrow_first). In a cluster (cluster_ctas > 1; this CTA's rank there) the tile's blocks
// are those of the cluster's query tiles together, which every CTA of it loads in step; each
// slice's visible blocks stay its own rows' (under a mask they then skip the blocks only the
// later tiles see, Consumer::mma_tile).
template <class Mask>
__device__ __forceinline__ TileAnnouncement announcement_of(const Mask& mask, const WorkTile& t, bool valid,
                                                            int consumer_warpgroups, int steps, bool narrow,
                                                            int cluster_rank = 0, int cluster_ctas = 1) {
  TileAnnouncement a{};
  a.index = valid ? t.index : kNoTile;
  if (!valid) return a;
  a.first_row = t.first_row;
  a.head = t.head;
  a.batch = t.batch;
  a.part = t.part;
  a.slot = t.slot;
  a.q_start = t.q_start;
  a.len_q = t.len_q;
  a.len_k = t.len_k;
  a.blocks = mask.kv_blocks(t.first_row - cluster_rank * consumer_warpgroups * kWarpgroupRows, cluster_ctas);
  if (t.part != kWholeTile) {
    // A dense batch's tiles have count == steps; a variable-length one splits only where
    // steps x steps fits 32 bits (fwd_work), so count x step does.
    const int count = a.blocks.count();
    const auto block_at = [&](int step) { return a.blocks.lo + (count == steps ? step : count * step / steps); };
    a.blocks = {block_at(t.step_lo), block_at(t.step_hi)};
  }
  // Rows outside [0, mask.rows()) are never stored: bound the interior test by the real rows (any
  // one row when the slice has none).
  const int64_t len_q = mask.rows();
#pragma unroll
  for (int wg = 0; wg < kMaxConsumerWarpgroups; ++wg) {
    if (wg >= consumer_warpgroups) break;
    const int64_t row_first = int64_t{t.first_row} + wg * kWarpgroupRows;
    const int64_t last = row_first + kWarpgroupRows - 1;
    const int64_t real_last = last < len_q ? last : len_q - 1;
    const int64_t row_last = real_last >= row_first ? real_last : row_first;
    a.uncut[wg] = mask.uncut_blocks(row_first, row_last);
    a.visible[wg] = a.blocks;
    if constexpr (Mask::kSlicesSkipBlocks) {
      const KVBlockRange seen = mask.kv_blocks_of_rows(row_first, row_last);
      a.visible[wg] = {seen.lo > a.blocks.lo ? seen.lo : a.blocks.lo, seen.hi < a.blocks.hi ? seen.hi : a.blocks.hi};
    }
    if constexpr (Mask::kNarrowsFirstBlock) {
      if (narrow && a.visible[wg].count() > 0 && mask.narrow_block(row_last, a.visible[wg].hi - 1))
        a.narrow_first |= 1u << wg;
    }
  }
  return a;
}

__device__ __forceinline__ void announce(TileAnnouncement& dst, const TileAnnouncement& a) {
  const int* words = reinterpret_cast<const int*>(&a);
  int* out = reinterpret_cast<int*>(&dst);
#pragma unroll
  for (int w = 0; w < kAnnouncementWords; ++w) atomicExch(&out[w], words[w]);
}

// Consumer warp: lane w reads word w (one shared-memory atomic per warp); the fields come back
// by shuffles with constant (or warp-uniform) source lanes, so ptxas knows them warp-uniform.
__device__ __forceinline__ AnnouncedTile read_announcement(TileAnnouncement& src, int lane, int warpgroup) {
  int* words = reinterpret_cast<int*>(&src);
  const int mine = lane < kAnnouncementWords ? atomicAdd(&words[lane], 0) : 0;
  const auto word = [&](size_t byte_offset) {
    return __shfl_sync(0xffffffffu, mine, static_cast<int>(byte_offset / sizeof(int)));
  };
  constexpr size_t kHi = offsetof(KVBlockRange, hi);
  const size_t my_uncut = offsetof(TileAnnouncement, uncut) + warpgroup * sizeof(KVBlockRange);
  const size_t my_visible = offsetof(TileAnnouncement, visible) + warpgroup * sizeof(KVBlockRange);
  const int first_row = word(offsetof(TileAnnouncement, first_row));
  const int len_q = word(offsetof(TileAnnouncement, len_q)), len_k = word(offsetof(TileAnnouncement, len_k));
  // The producer's fields (a part's steps, the sequence's K/V rows, the scan position) stay 0.
  const WorkTile tile{.index = word(offsetof(TileAnnouncement, index)),
                      .first_row = first_row,
                      .head = word(offsetof(TileAnnouncement, head)),
                      .batch = word(offsetof(TileAnnouncement, batch)),
                      .part = word(offsetof(TileAnnouncement, part)),
                      .slot = word(offsetof(TileAnnouncement, slot)),
                      .q_start = word(offsetof(TileAnnouncement, q_start)),
                      .len_q = len_q,
                      .len_k = len_k};
  return {tile,
          {word(offsetof(TileAnnouncement, blocks)), word(offsetof(TileAnnouncement, blocks) + kHi)},
          {word(my_visible), word(my_visible + kHi)},
          {first_row + warpgroup * kWarpgroupRows, {word(my_uncut), word(my_uncut + kHi)}, len_q, len_k},
          ((word(offsetof(TileAnnouncement, narrow_first)) >> warpgroup) & 1) != 0};
}

}  // namespace fusedattn::cuda::sm90
