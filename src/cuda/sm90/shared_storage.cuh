// Shared memory of one CTA: the Q slots (reused as O staging), the K/V pipeline stages and the
// barriers. Its sizeof() is the dynamic shared-memory request.
#pragma once

#include <cstdint>

#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/tile_announcement.cuh"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg>
struct SharedStorage {
  static constexpr int kClusterCtas = Cfg::kClusterCtas;  // CTAs whose consumers free each K/V stage
  static constexpr int kQSlotElems = Cfg::kQSlotRows * Cfg::kTileCols;
  static constexpr int kKVElems = Cfg::kBlockN * Cfg::kTileCols;
  // 1024-byte alignment: every tile starts a 128B-swizzle atom, so wgmma descriptors use base
  // offset 0 and the TMA's swizzle pattern matches the one wgmma assumes.
  // Q slots: whole Q tiles, used in turn by consecutive tiles of the CTA (a ring of kQBuffers),
  // or with Cfg::kWarpgroupQ one warpgroup's rows each (TileRing::warpgroup_q_slot). Each is also
  // O staging for the TMA store in the epilogue.
  alignas(1024) Element q[Cfg::kQSlots][kQSlotElems];
  alignas(1024) Element k[Cfg::kStages][kKVElems];
  alignas(1024) Element v[Cfg::kVStages][kKVElems];
  uint64_t q_full[Cfg::kQSlots];   // TMA -> consumers: Q landed
  // consumers -> producer: Q slot free for a later tile (its O stored, or with kStagesOInKV the
  // last Q K^T done); one arrival per warp that reads it.
  uint64_t q_empty[Cfg::kQSlots];
  uint64_t k_full[Cfg::kStages];
  uint64_t v_full[Cfg::kVStages];
  uint64_t k_empty[Cfg::kStages];  // consumers -> producer: the stage's K consumed
  uint64_t v_empty[Cfg::kVStages];  // consumers -> producer: the stage's V consumed
  // Announcement slots (tile_announcement.cuh), used in turn (TileRing). An announcement has its
  // own barriers rather than riding on its Q's: the consumers read it and set their tile up
  // while the Q load is still in flight.
  TileAnnouncement tile[kAnnouncementSlots];
  uint64_t tile_full[kAnnouncementSlots];   // producer -> consumers: the slot holds the next tile
  uint64_t tile_empty[kAnnouncementSlots];  // consumers -> producer: read for the last time; one arrival per consumer warp
  // kStagesOInKV: consumers -> producer, per stage, the O staged in its K (part 0, warpgroup 0)
  // or V (part 1, warpgroup 1) has been read by its TMA store; the producer waits before refilling.
  uint64_t o_read[Cfg::kStages][2];
  MaskedSlice slice[Cfg::kConsumerWarps];  // each consumer warp's current tile, for its mask (Consumer)
  int split_last[kMaxConsumerWarpgroups];  // per warpgroup: it drew its split tile's last ticket (SplitCombine)
  // MaskKind::kColumn: per K stage, its block's index and the column mask's cut bit
  // (sm90/column_mask.cuh, ColumnTag). Last, so the other kinds' fields keep their offsets.
  int column_tag[Cfg::kStages];
  // A masked cluster's dynamic schedule (Producer::next_tile): rank 0's producer stores each item
  // it fetches into every peer's slot of the fetch (the fetch count's low bit), completing the
  // peer's fetch_full; the peer's producer arrives on rank 0's fetch_empty once it has read it.
  // After the column tags, so the other kernels' fields keep their offsets.
  uint64_t fetch_full[kAnnouncementSlots];
  uint64_t fetch_empty[kAnnouncementSlots];
  int fetched[kAnnouncementSlots];
};

template <typename Element, class Cfg>
constexpr int shared_bytes() {
  constexpr int bytes = static_cast<int>(sizeof(SharedStorage<Element, Cfg>));
  static_assert(bytes <= Cfg::kSharedBytesLimit, "tile configuration exceeds its share of an SM's shared memory");
  static_assert(bytes <= Cfg::kQSlots * Cfg::kQSlotRows * Cfg::kTileCols * static_cast<int>(sizeof(Element)) +
                             (Cfg::kStages + Cfg::kVStages) * Cfg::kKVTileBytes + Cfg::kBarrierBytes,
                "kBarrierBytes in tile_config.h is too small: the Q buffer count was chosen on a wrong size");
  return bytes;
}

}  // namespace fusedattn::cuda::sm90
