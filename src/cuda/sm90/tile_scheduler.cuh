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
// SplitParams) the shares of the last tiles, which come after every whole tile. A share runs as
// one or more segments (parts of consecutive tiles, cuda/common/tail_shares.h): next() walks
// a share's segments before it takes another item, so the schedule hands out shares, not
// segments.
//
// A variable-length batch numbers only the tiles that exist: sequence by sequence, and in each
// its heads in the grouped order above (groups of heads instead of (head, batch) pairs; a head's
// query blocks last first). Under a causal mask head-major order ran the last head's longest
// tiles near the launch's end (H200, 8 sequences of 2048, d128 causal: 448-453 TFLOP/s
// head-major, 464-470 grouped). Sequence b holds tile heads * ceil(tiled rows(b) / block_m) tiles
// (with GQA packing a sequence's tiled rows are its positions times the group); which
// sequence holds item i takes a scan of cu_seqlens_q. A CTA's items only grow, so it scans on from its last tile's sequence
// (carried in WorkTile) and reads each offset about once per launch. Past the last sequence
// there is no tile; nothing in the kernel knows the count beforehand, so the dynamic schedule's
// counter is zeroed on the stream behind each such launch instead of by the last fetch.
#pragma once

#include <climits>

#include "cuda/common/int_math.h"
#include "cuda/common/schedule.h"
#include "cuda/ptx/cluster.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/row_packing.h"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

constexpr int kWholeTile = -1;  // WorkTile::part of a tile run whole

struct WorkTile {
  int index;      // the work item
  int first_row;  // the query block's first row
  int head;
  int batch;
  int part;  // kWholeTile, or which part of a split tile
  int slot;  // a split tile's item in the plan's tail (its position among the split tiles)
  // The tile's sequence (seq_info()): its first rows in the packed tensors (0 for dense batches)
  // and lengths; int32 like the TMA coordinates.
  int q_start, k_start, len_q, len_k;
  int batch_first;  // variable-length batches: the tile index of the sequence's first tile
  // A part's steps [step_lo, step_hi) of the plan's steps per tile (TailShares::steps), which the
  // producer maps onto the tile's KV blocks (tile_announcement.cuh); the consumers read 0.
  int step_lo, step_hi;
};

// kSplits: the launch may cut its last tiles into shares (full masks); masked launches never do,
// and their producer keeps the plain tile walk.
// kClusterCtas = 2 (full masks of a dense batch, KernelConfig::kClusterCtas): the work items are
// pairs of adjacent query blocks of one (head, batch), a pair per cluster at a time in round
// robin, and the CTA of rank r takes the pair's block r. A split pair's shares are the pair's:
// both CTAs run the same steps of their two blocks (the K/V blocks they share), each with a
// workspace slot of its own, 2 x the pair's tail item + r (SplitCombine::workspace_slot). Under a
// mask (d256's causal and window pairs, fwd_split.h: pairs_masked) the pairs go in the grouped
// longest-first order above, a pair counting as one item of a (head, batch) with half the blocks,
// and where the launch has a counter rank 0 fetches each next item and hands it to its peer
// (Producer::next_tile). A (head, batch) with an odd number of query blocks ends on a pair whose
// second block lies past the sequence: that CTA's warpgroups pass the tile through
// (Consumer::slice_is_empty) and only load their share of its K/V.
template <bool kSplits, int kClusterCtas = 1>
class TileScheduler {
 public:
  // counter: zero at launch, or null for the static schedule. heads: tile heads (packing's).
  __device__ TileScheduler(const FwdParams& p, int num_m_blocks, int block_m, int heads, RowPacking packing,
                           int group_shift, const SplitParams& split, int* counter)
      : order_{num_m_blocks, group_shift},
        block_m_(block_m),
        heads_(heads),
        packing_(packing),
        plan_(split.plan),
        counter_(counter),
        p_(p) {}

  // item_offset: a clustered launch's first item (KernelParams::item_offset), where it runs a
  // share of the work list.
  __device__ WorkTile first(int item_offset = 0) const {
    const int index = static_cast<int>(blockIdx.x) / kClusterCtas + (kClusterCtas > 1 ? item_offset : 0);
    return at(index, kShareStart, 0, 0);
  }

  // Called once per tile by the producer thread, including once past the last one.
  __device__ WorkTile next(const WorkTile& t) const {
    // A share goes on with its next segment, the next tile's first steps, while it has steps left.
    const int share_end = kSplits && t.part != kWholeTile ? plan_.share_begin(t.index - plan_.whole + 1) : 0;
    const int end = t.slot * plan_.steps + t.step_hi;
    const bool goes_on = end < share_end;
    return at(goes_on ? t.index : fetch(t.index), goes_on ? end : kShareStart, t.batch, t.batch_first);
  }

  // The CTA's (or the cluster's) next work item after `index`; in a masked cluster with a counter
  // only rank 0 calls it (its peers take what it hands them, Producer::next_tile).
  __device__ int fetch(int index) const {
    const int slots = static_cast<int>(gridDim.x) / kClusterCtas;  // CTAs, or clusters
    if constexpr (kClusterCtas > 1 && kSplits) return index + slots;  // full masks' clusters: static only
    if (counter_ == nullptr) return index + slots;
    const int taken = atomicAdd(counter_, 1);
    // Every slot ends with exactly one fetch past the last item, so a launch makes
    // (total - slots) + slots = total fetches: the one that returns total - 1 is the launch's
    // last, and it leaves the counter at zero for the next launch on the stream. (A
    // variable-length launch's total is only a bound on its fetches; a memset behind it zeroes
    // the counter.)
    if (taken == plan_.items() - 1) atomicExch(counter_, 0);
    return slots + taken;
  }

  __device__ bool is_valid(const WorkTile& t) const { return t.index < plan_.items(); }

  // from: the flattened tail step a share's segment starts at, or kShareStart for its first.
  static constexpr int kShareStart = -1;

  // Work item `index`'s tile and, for a share, the segment starting at `from`: which part of
  // which tile, with its workspace slot and steps.
  struct ItemTile {
    int tile, part, slot, step_lo, step_hi;
  };
  __device__ ItemTile item_tile(int index, int from) const {
    if (!kSplits || index < plan_.whole || index >= plan_.items()) return {index, kWholeTile, 0, 0, 0};
    return share_segment(index - plan_.whole, from);
  }
  // Not inlined: the divisions' registers would count against the consumers' (ptxas allocates
  // for the whole kernel; inlined, this spilled 4 B of d96's consumers). The call puts the
  // scheduler on the producer thread's stack (64 B, no spill); the plan passed by value in
  // registers instead brought d96's 4 B back.
  __device__ __noinline__ ItemTile share_segment(int share, int from) const {
    const int x = from == kShareStart ? plan_.share_begin(share) : from;
    const TailSegment s = plan_.segment_at(x, plan_.share_begin(share + 1));
    return {plan_.whole + s.item, s.part, s.item, s.step_lo, s.step_hi};
  }

  // A variable-length launch scans on from the previous tile's sequence b (first: its first tile).
  __device__ WorkTile at(int index, int from, int b, int first) const {
    return kClusterCtas == 1 && varlen() ? varlen_tile_at(index, from, b, first) : tile_at(index, from);
  }

  __device__ WorkTile tile_at(int index, int from) const {
    const ItemTile it = item_tile(index, from);
    ScheduledItem item;
    int m_block;
    if constexpr (kClusterCtas > 1) {
      const int pairs = cluster_items(order_.blocks, kClusterCtas);  // per (head, batch)
      const int rank = static_cast<int>(ptx::cluster_ctarank());
      int cluster_block;  // the item's place among its (head, batch)'s clusters of query blocks
      if constexpr (kSplits) {  // full masks: equal items, head-major
        item.pair = it.tile / pairs;
        cluster_block = it.tile - item.pair * pairs;
      } else {  // masked: the longest (last) query blocks first, as unclustered
        item = scheduled_item({pairs, order_.shift}, it.tile);
        cluster_block = pairs - 1 - item.rank;
      }
      m_block = cluster_block * kClusterCtas + rank;
    } else {
      item = scheduled_item(order_, it.tile);
      m_block = order_.blocks - 1 - item.rank;
    }
    return {.index = index,
            .first_row = m_block * block_m_,
            .head = item.pair % heads_,
            .batch = item.pair / heads_,
            .part = it.part,
            .slot = it.slot,
            .q_start = 0,
            .k_start = 0,
            .len_q = static_cast<int>(p_.seqlen_q),
            .len_k = static_cast<int>(p_.seqlen_k),
            .batch_first = 0,
            .step_lo = it.step_lo,
            .step_hi = it.step_hi};
  }

  // Item `index` of a variable-length launch, scanning from sequence b, whose first tile is tile
  // `first` (the item's tile >= first); past the last sequence, an item that is_valid() rejects.
  __device__ WorkTile varlen_tile_at(int index, int from, int b, int first) const {
    const ItemTile it = item_tile(index, from);
    // Each sequence's rows as seq_info() bounds them (params.h): inside the packed rows, at most
    // max_seqlen_q of them, whatever offsets the device check will find at fault. In 32 bits, as
    // the kernel counts rows: the same bounds in 64 bits made ptxas spill 400-436 B in d256's
    // unpaired instances.
    const int rows_q = to_int(p_.varlen_rows_q);
    int q_start = clamp_int(p_.cu_seqlens_q[b], 0, rows_q), q_end = 0, m_blocks = 0;
    for (;; ++b) {
      if (b >= p_.batch) return {.index = plan_.items(), .batch = b, .part = kWholeTile, .batch_first = first};
      q_end = clamp_int(p_.cu_seqlens_q[b + 1], q_start, rows_q);
      m_blocks = static_cast<int>(ceil_div(packing_.rows(int64_t{len_q(q_start, q_end)}), block_m_));
      if (it.tile < first + heads_ * m_blocks) break;
      first += heads_ * m_blocks;
      q_start = q_end;
    }
    const ScheduledItem item = scheduled_item({m_blocks, order_.shift}, it.tile - first);
    const int m_block = m_blocks - 1 - item.rank;
    const int rows_k = to_int(p_.varlen_rows_k);
    const int k_start = clamp_int(p_.cu_seqlens_k[b], 0, rows_k);
    const int k_end = clamp_int(p_.cu_seqlens_k[b + 1], k_start, rows_k);
    return {.index = index,
            .first_row = m_block * block_m_,
            .head = item.pair,
            .batch = b,
            .part = it.part,
            .slot = it.slot,
            .q_start = q_start,
            .k_start = k_start,
            .len_q = len_q(q_start, q_end),
            .len_k = static_cast<int>(used_keys(p_, b, min(k_end - k_start, to_int(key_bound(p_))))),
            .batch_first = first,
            .step_lo = it.step_lo,
            .step_hi = it.step_hi};
  }

 private:
  ScheduleOrder order_;
  int block_m_;
  int heads_;
  RowPacking packing_;
  TailShares plan_;
  int* counter_;
  const FwdParams& p_;

  __device__ bool varlen() const { return p_.cu_seqlens_q != nullptr; }
  // A sequence's query rows [q_start, q_end), cut to max_seqlen_q as seq_info() cuts them.
  __device__ int len_q(int q_start, int q_end) const { return min(q_end - q_start, to_int(p_.seqlen_q)); }
  // n as an int, at most INT_MAX: offsets are int32, so no offset in range changes by the cut.
  __device__ static int to_int(int64_t n) { return static_cast<int>(min(n, int64_t{INT_MAX})); }
  __device__ static int clamp_int(int x, int lo, int hi) { return x < lo ? lo : (x < hi ? x : hi); }
};

}  // namespace fusedattn::cuda::sm90
