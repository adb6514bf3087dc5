// Shared-memory layout of the sm80 backward kernel and the per-CTA problem coordinates.
#pragma once

#include <cstdint>

#include "cuda/sm80/bwd_mask.h"
#include "cuda/sm80/bwd_tile.h"
#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda::sm80 {

// Every 16-bit tile is stored row-major with the XOR swizzle of cuda/common/swizzle.cuh. K and V
// stay for the whole CTA; Q, dO, lse2 and delta are double-buffered per query block when
// kStages == 2; dS^T ([key][query]) is the hand-off from the per-warp dS to the dQ warp grid and,
// with column warps, P^T and dS^T are the hand-off to the partner warps of the same key rows.
// Once dK and dV of an iteration are done, its Q and dO are dead until the load of the query
// block after next, so the fp32 dQ tile (bwd_tile_io.cuh) is staged in their place on its way
// to the coalesced global adds -- or, with dq_buffer, in a buffer of its own, which column warps
// may fill while their partners still read Q and dO.
// The kernel's dynamic shared memory starts on this boundary (one 128-byte swizzle group), and
// so does every 16-bit tile below: the tiles before them are whole rows of whole groups. The
// stage-address swizzle of the Q/dO reads (kXorStageAddress, bwd_warp_mma.cuh) relies on it.
constexpr int kBwdTileAlignBytes = kSwizzlePitchMultiple * 2;

// A CTA's item (bwd_cta in bwd_kernel.cuh): KV block n of (sequence b, KV head kvh), and on rows
// that split which part of its item it runs.
struct BwdCta {
  int n, kvh, b;
  int item;   // the split-slot index is item - whole (full masks)
  int part;   // 0 and 1 when the item runs whole
  int parts;
};

template <typename Element, int kHeadDim, bool kLargeSmem = false>
struct BwdShared {
  using T = BwdTile<kHeadDim, kLargeSmem>;
  static_assert(sizeof(Element) * T::kPitch % kBwdTileAlignBytes == 0 &&
                    sizeof(Element) * T::kDsPitch % kBwdTileAlignBytes == 0,
                "tile rows are whole swizzle groups, so every tile starts on a group boundary");
  struct QueryStage {
    alignas(16) Element q[T::kBlockM * T::kPitch];
    alignas(16) Element dout[T::kBlockM * T::kPitch];
    // The staged fp32 dQ tile, over q and dout (adjacent: q is a whole number of 16-byte chunks).
    __device__ float* dq() { return reinterpret_cast<float*>(q); }
  };
  static_assert(sizeof(QueryStage) >= sizeof(float) * T::kBlockM * kHeadDim, "the dQ tile fits over Q and dO");
  alignas(16) Element k[T::kBlockN * T::kPitch];
  alignas(16) Element v[T::kBlockN * T::kPitch];
  QueryStage stage[T::kStages];
  alignas(16) Element ds[T::kBlockN * T::kDsPitch];
  alignas(16) Element pt[T::kScoresShared ? T::kBlockN * T::kDsPitch : kSwizzleChunkElems];  // one chunk without column warps
  alignas(16) float dq_stage[T::kDqBuffer ? T::kBlockM * kHeadDim : kSwizzleChunkElems];  // a chunk without dq_buffer
  alignas(16) float lse2[T::kStages][T::kBlockM];
  alignas(16) float delta[T::kStages][T::kDeltaInDp ? 2 * T::kBlockM : T::kBlockM];  // -delta (as C-fragment quads)
  BwdCta kept_cta;  // the CTA's item, kept across the main loop by rows that split (bwd_kernel.cuh)
};

// Where one CTA works: KV block n of (sequence b, KV head kvh), looping over the group's query
// heads and the query blocks that see the KV block.
struct BwdCoords {
  int b, kvh, group;
  int64_t n;
  SeqInfo seq;
  BlockRange m_blocks;
  int iterations;  // group * |m_blocks| (< 2^31: a block count, not an element offset)
};

// The (query head, query block) of one main-loop iteration, advanced incrementally: splitting
// an iteration index instead would cost 64-bit divisions every iteration (measured ~5%). Each
// head's query blocks go up, or with kDown down (first_block).
template <bool kDown = false>
struct QueryCursor {
  int h;
  int m;     // a block index: 32 bits, like every block count
  int left;  // blocks of this head not yet visited, this one included

  FUSEDATTN_HD static int first_block(const BwdCoords& c) {
    return static_cast<int>(kDown ? c.m_blocks.end - 1 : c.m_blocks.begin);
  }

  // Returns true when the cursor moved on to the next query head.
  FUSEDATTN_HD bool advance(const BwdCoords& c) {
    if (--left > 0) {
      m += kDown ? -1 : 1;
      return false;
    }
    ++h;
    m = first_block(c);
    left = static_cast<int>(c.m_blocks.end - c.m_blocks.begin);
    return true;
  }
};

}  // namespace fusedattn::cuda::sm80
