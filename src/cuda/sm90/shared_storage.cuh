// Shared memory of one CTA: the Q tile(s) (reused as O staging), the K/V pipeline stages and the
// barriers. Its sizeof() is the dynamic shared-memory request.
#pragma once

#include <cstdint>

#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/tile_announcement.cuh"
#include "cuda/sm90/tile_config.h"

namespace fusedattn::cuda::sm90 {

template <typename Element, class Cfg>
struct SharedStorage {
  static constexpr int kQElems = Cfg::kBlockM * Cfg::kHeadDim;
  static constexpr int kKVElems = Cfg::kBlockN * Cfg::kHeadDim;
  // 1024-byte alignment: every tile starts a 128B-swizzle atom, so wgmma descriptors use base
  // offset 0 and the TMA's swizzle pattern matches the one wgmma assumes.
  // Q tiles, used in turn by consecutive tiles of the CTA (a ring of kQBuffers); each is also
  // its tile's O staging for the TMA store in the epilogue.
  alignas(1024) Element q[Cfg::kQBuffers][kQElems];
  alignas(1024) Element k[Cfg::kStages][kKVElems];
  alignas(1024) Element v[Cfg::kStages][kKVElems];
  uint64_t q_full[Cfg::kQBuffers];   // TMA -> consumers: Q landed
  uint64_t q_empty[Cfg::kQBuffers];  // consumers -> producer: O stored, Q buffer free for a later tile
  uint64_t k_full[Cfg::kStages];
  uint64_t v_full[Cfg::kStages];
  uint64_t k_empty[Cfg::kStages];  // consumers -> producer: the stage's K consumed
  uint64_t v_empty[Cfg::kStages];  // consumers -> producer: the stage's V consumed
  TileAnnouncement tile[Cfg::kQBuffers];  // producer -> consumers: the tile q_full announces
  MaskedSlice slice[Cfg::kConsumerWarps];  // each consumer warp's current tile, for its mask (Consumer)
  int split_last[kMaxConsumerWarpgroups];  // per warpgroup: it drew its split tile's last ticket (SplitCombine)
};

template <typename Element, class Cfg>
constexpr int shared_bytes() {
  constexpr int bytes = static_cast<int>(sizeof(SharedStorage<Element, Cfg>));
  static_assert(bytes <= kMaxSharedBytesPerBlock, "tile configuration exceeds the shared memory of an SM");
  static_assert(bytes <= Cfg::kQBuffers * Cfg::kQTileBytes + 2 * Cfg::kStages * Cfg::kKVTileBytes + Cfg::kBarrierBytes,
                "kBarrierBytes in tile_config.h is too small: the Q buffer count was chosen on a wrong size");
  return bytes;
}

}  // namespace fusedattn::cuda::sm90
