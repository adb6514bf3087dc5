// Tile of the Hopper backward main kernel (bwd_kernel.cuh) and its shared-memory layout.
//
// A CTA owns kBlockN keys of one (sequence, KV head) and walks the query blocks of kBlockM rows
// that see them. At d64 and d128 two warpgroups own 64 key rows each (the M of every wgmma that
// produces a per-key result: S^T, dP^T, dV, dK), and dQ of a query block (kBlockM x head dim) is
// split between them: at d128 by 64-column slabs, at d64 by 64-row halves of its 128 queries
// (BwdTile::kDqSplitsRows). At d256 dK and dV of 64 keys x 256 columns do not fit one
// warpgroup's registers (BwdTile::kSplitsColumns): both warpgroups share the block's 64 keys,
// each owns half the columns of dK, dV and dQ and half the queries of S^T and dP^T.
//
// d64 runs 128-query blocks, as FlashAttention-3's d64 backward tile (128 x 128): on 64-query
// blocks every GEMM had N = 64 and a block's fixed costs (its barriers, waits, dQ hand-over and
// reductions) came twice as often per FLOP; 128 took d64 from 0.83-0.99x cuDNN to 0.92-1.06x
// (docs/perf.md, sixty-fourth session). On the tile before the producer warpgroup, whose compute
// threads also loaded, 128-query blocks had spilled 68-84 B (fifty-sixth session).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/dq_rows.h"
#include "cuda/sm90/tile_config.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm90 {

constexpr int kBwdWarpSize = 32;
constexpr int kBwdWarpgroupWarps = 4;
constexpr int kBwdWarpgroupThreads = kBwdWarpgroupWarps * kBwdWarpSize;
constexpr int kBwdWgmmaK = 16;      // the k of every 16-bit wgmma (m64nNk16)
constexpr int kBwdAccRows = 16;     // rows of a warp's share of a wgmma accumulator
// The 128-byte swizzle's geometry, as the forward's tiles (ptx/wgmma.cuh) and the portable
// kernels' (common/swizzle.cuh: chunk c of row r sits at swizzle_chunk(r, c) = c ^ (r % 8)).
constexpr int kBwdSlabElems = kSwizzlePitchMultiple;  // one swizzle row of 16-bit elements (64)
constexpr int kBwdRowBytes = static_cast<int>(ptx::kSwizzleRowBytes);    // bytes of such a row
constexpr int kBwdAtomBytes = static_cast<int>(ptx::kSwizzleAtomBytes);  // its 8-row atom (the SBO)
static_assert(kBwdSlabElems * 2 == kBwdRowBytes && kBwdAtomBytes == kSwizzleRows * kBwdRowBytes,
              "the portable kernels' swizzle is the wgmma descriptors' 128-byte one");

#ifndef FUSEDATTN_SM90_BWD_DQ_INTERLEAVE_D256
#define FUSEDATTN_SM90_BWD_DQ_INTERLEAVE_D256 0
#endif
#ifndef FUSEDATTN_SM90_BWD_LSE_BEFORE_ISSUE
#define FUSEDATTN_SM90_BWD_LSE_BEFORE_ISSUE 1
#endif

template <int kHeadDim>
struct BwdTile {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "the Hopper backward has d64, d128 and d256 tiles");
  static constexpr int kWarpgroups = 2;
  static constexpr int kWarpgroupKeys = 64;  // wgmma's M
  // d256: the warpgroups split columns, not keys. P^T and dS^T then pass through shared memory
  // (each warpgroup forms half the queries' and reads all of them), and dV and dK read them from
  // there. K, V, two Q/dO stages and two P^T and dS^T buffers fill the shared memory, leaving no
  // room of its own to stage dQ: it is staged in the stage's Q and dO tiles (kDqInStage).
  static constexpr bool kSplitsColumns = kHeadDim > 2 * kBwdSlabElems;
  static constexpr int kBlockN = kSplitsColumns ? kWarpgroupKeys : kWarpgroups * kWarpgroupKeys;
  // d64's tile (a head dim of one slab): 128-query blocks (see the header comment). kStages,
  // kDqSplitsRows and kDqBuffers follow from it.
  static constexpr bool kWideBlocks = kHeadDim <= kBwdSlabElems;
  // S^T's N and the reduction of dV and dK.
  static constexpr int kBlockM = kWideBlocks ? kWarpgroups * kWarpgroupKeys : kWarpgroupKeys;
  // S^T's and dP^T's N: at d256 a warpgroup's half of the block's queries; at d64 and d128 64
  // queries a pass, kScorePasses passes a block. d64's one pass of 128 queries (S^T and dP^T 64 x
  // 128 each in fp32 beside dK and dV) left too few of the 240 registers: ptxas spilled and
  // serialised every wgmma.
  static constexpr int kScoreQueries = kSplitsColumns ? kBlockM / kWarpgroups : kWarpgroupKeys;
  static constexpr int kScorePasses = kSplitsColumns ? 1 : kBlockM / kScoreQueries;
  // dK += dS^T Q reads dS^T from shared memory (wgmma SS) rather than registers (RS) where dS^T
  // passes through shared memory whole (d256) or its registers are better spent (d64, whose
  // passes would keep all 128 queries' dS^T packed beside the next pass's S^T and dP^T).
  static constexpr bool kDkFromShared = kSplitsColumns || kScorePasses > 1;
  static constexpr int kColumns = kSplitsColumns ? kHeadDim / kWarpgroups : kHeadDim;     // its dK/dV N
  // Warpgroup 0 produces (one thread of warp 0 loads K/V once and each block's Q, dO, lse2 and
  // delta by TMA; warp 1 adds dQ to the workspace by TMA reductions); warpgroups 1 and 2 compute.
  // setmaxnreg moves registers within the CTA only (168 a thread at launch): the producer keeps
  // setmaxnreg's minimum, the compute threads take the rest. A sum over the CTA's launch share
  // blocks the compute warps' setmaxnreg.inc for good (session 60: 32 + 2 x 240 hung every launch).
  static constexpr int kMmaThreads = kWarpgroups * kBwdWarpgroupThreads;
  static constexpr int kThreads = kMmaThreads + kBwdWarpgroupThreads;
  static constexpr int kProducerRegs = kProducerRegisters;
  static constexpr int kMmaRegs = consumer_registers(kWarpgroups, 1, kProducerRegs);
  static_assert(kMmaRegs == 240, "the compute warpgroups' wgmmas serialise below 240 registers");
  // Q/dO/lse2/delta: the producer works two blocks ahead at d128 (a third stage fits beside K, V,
  // two dS^T buffers and the dQ staging); one ahead at d256 and at d64, whose stages and dS^T
  // buffers are twice d128's (128 queries) and whose two dQ buffers take the third's room.
  static constexpr int kStages = kSplitsColumns || kWideBlocks ? 2 : 3;
  // dQ = dS K of a query block (kBlockM x head dim over the block's kBlockN keys) is split between
  // the warpgroups, each a 64 x 64 tile (wgmma's M by one slab of K read MN-major, whose
  // descriptors start on a slab) summed over every key of the block: at d128 by column slabs, at
  // d64 (one slab) by row halves. At d256 by 128-column halves, staged in the stage (kDqInStage).
  static constexpr bool kDqSplitsRows = kWideBlocks;
  static constexpr int kDqRows = kWarpgroupKeys;                                      // wgmma's M
  static constexpr int kDqCols = kDqSplitsRows ? kHeadDim : kHeadDim / kWarpgroups;  // its N
  static constexpr bool kDqStaged = !kSplitsColumns;  // in buffers of its own (d256: kDqInStage)
  // Where warpgroup w's dQ tile starts in the block.
  static constexpr int dq_row0(int w) { return kDqSplitsRows ? w * kDqRows : 0; }
  static constexpr int dq_col0(int w) { return kDqSplitsRows ? 0 : w * kDqCols; }
  // Staging buffers for dQ, used in turn: d64 has the room for two, so a block's dQ need not wait
  // for the writer's reductions to have read the block before's (the wait before the staging:
  // ~5% of d64's stall samples, ncu at full 8k, on 64-query blocks).
  static constexpr int kDqBuffers = kWideBlocks ? 2 : 1;
  // d256: each warpgroup stages its block's dQ (64 rows x its 128 columns in fp32, 32 KiB) in the
  // stage's Q and dO slabs that only its own dK and dV read, once they have; the writer warp adds
  // it to the workspace by TMA reductions and then gives the stage back. (Added from registers by
  // 8-byte reds, the adds filled the LSU queue and L2 ran at 88% of its peak: ncu, full 8k.)
  static constexpr bool kDqInStage = kSplitsColumns;
  // The staged dQ rows interleaved (dq_rows.h): +1-3% on the backward at d64/d128,
  // 4-7% slower at d256, whose stage waits for the reductions (docs/hopper.md, session 76). d256
  // keeps the plain order unless built with -DFUSEDATTN_SM90_BWD_DQ_INTERLEAVE_D256=1 (an A/B switch).
  static constexpr bool kDqInterleaved = kDqStaged || FUSEDATTN_SM90_BWD_DQ_INTERLEAVE_D256 != 0;
  // lse2's and delta's pairs read into registers before the waits on S^T's and dP^T's wgmmas
  // (bwd_kernel.cuh's RowPairs), not after them: d64's backward +6.5% at full 2k and +3.9% at
  // causal 4k; every pass's lse2 read under the first pass's S^T, a further +0.5-4.2%. At d128
  // and d256 both early read 0.2-0.7% behind, and lse2's alone even to 1.5% behind (A/Bs,
  // docs/hopper.md session 78), so there they are read after the waits.
  static constexpr bool kRowPairsAhead = kWideBlocks;
  // d128 reads its lse2 pairs before it issues the block's S^T and dP^T instead (kLseBeforeIssue):
  // read after the wait, five of the probabilities' FFMAs waited on them (7.9% of the stall
  // samples, ncu at full 2k), and read between the issue and the wait they gained nothing. Before
  // the issue, against after the wait: full 1k +2.0%, 2k +2.4%, 8k +8.1%, causal 4k +1.2% (H200,
  // docs/hopper.md session 80). delta's pairs there too spilled 20 B in the window kernels; d256's
  // lse2 there was even (+0.5%, +0.6%, -0.4%). -DFUSEDATTN_SM90_BWD_LSE_BEFORE_ISSUE=0 reads them
  // after the wait.
  static constexpr bool kLseBeforeIssue = FUSEDATTN_SM90_BWD_LSE_BEFORE_ISSUE != 0 && !kRowPairsAhead && !kSplitsColumns;
  static_assert(kSplitsColumns || (kDqCols == kBwdSlabElems && kDqRows * kWarpgroups * kDqCols == kBlockM * kHeadDim),
                "the warpgroups' dQ tiles, 64 x one slab of K each, cover the block's");
};

// dQ's staging order (dq_rows.h): its groups are the swizzle's rows, and the interleave makes a
// half-warp's staging store conflict free.
static_assert(kDqRowGroup == kSwizzleRows, "dQ's row groups are the 128-byte swizzle's rows");
// Each 16-byte chunk pair a half-warp's store writes (j: the pair's place in the row) is hit once.
constexpr bool dq_staging_is_conflict_free() {
  constexpr int kHalfWarpRows = kSwizzleRows / 2, kPairsPerRow = kSwizzleRows / 2;
  for (int half = 0; half < 2; ++half)
    for (int j = 0; j < kPairsPerRow; ++j) {
      int hits[kSwizzleRows] = {};
      for (int g = half * kHalfWarpRows; g < (half + 1) * kHalfWarpRows; ++g)
        for (int c = 2 * j; c < 2 * j + 2; ++c) ++hits[swizzle_chunk(dq_staged_row(g), c)];
      for (int h : hits)
        if (h != 1) return false;
    }
  return true;
}
static_assert(dq_staging_is_conflict_free(), "a half-warp's dQ staging store takes one shared wavefront");

// The kernel's TMA descriptors (bwd_launch.cuh): Q, dO, K, V, dK and dV as [batch, rows, heads,
// head dim] with boxes of one 64-column slab (kBlockM rows for Q and dO, kBlockN for K and V, a
// warpgroup's kWarpgroupKeys for the stores of dK and dV), and dQ's fp32 workspace with boxes of
// 32 columns. A variable-length batch's maps are one packed sequence.
struct BwdMaps {
  CUtensorMap q, dout, k, v, dk, dv, dq;
};

// Whether p is a variable-length batch, whose maps are one packed sequence (map_rows).
__device__ __forceinline__ bool packs_sequences(const BwdParams& p) { return p.cu_seqlens_q != nullptr; }
// The maps' batch coordinate of sequence b: 0 in a variable-length batch.
__device__ __forceinline__ int map_batch(const BwdParams& p, int b) { return packs_sequences(p) ? 0 : b; }

// Every 16-bit tile is [slab][row][64 elements] with the 128-byte swizzle (chunk ^= row % 8),
// each starting on an atom boundary: the layout TMA would write and wgmma's descriptors read, as
// K-major operands (rows are M/N, the head dim is the reduction) and as MN-major ones (rows are
// the reduction). dS^T is [key][query]: one slab of the kBlockM queries.
template <typename Element, int kHeadDim>
struct BwdSharedStorage {
  using T = BwdTile<kHeadDim>;
  struct Stage {
    alignas(kBwdAtomBytes) Element q[T::kBlockM * kHeadDim];
    alignas(kBwdAtomBytes) Element dout[T::kBlockM * kHeadDim];
  };
  // A stage's fp32 rows apart from its tiles: inside Stage they would pad it to the next atom,
  // and three such stages no longer fit.
  struct StageRows {
    alignas(16) float lse2[T::kBlockM];
    alignas(16) float delta[T::kBlockM];
  };
  alignas(kBwdAtomBytes) Element k[T::kBlockN * kHeadDim];
  alignas(kBwdAtomBytes) Element v[T::kBlockN * kHeadDim];
  // dS^T of two blocks in turn: a warpgroup may write block i + 1's while the other still reads
  // block i's for its dQ.
  alignas(kBwdAtomBytes) Element ds[2][T::kBlockN * T::kBlockM];
  Stage stage[T::kStages];
  // Beside the operands, one of two: at d64 and d128 dQ in fp32 as the boxes of its tensor
  // reductions, [buffer][box][kDqRows][32 floats] with the 128-byte swizzle (16-byte chunk c of row
  // r at c ^ (r % 8)), warpgroup w's tile in boxes kDqBoxesPerWarpgroup w..; at d256 (dQ staged
  // in the stage) P^T of two blocks in turn, as dS^T.
  static constexpr int kDqSlabFloats = kBwdRowBytes / sizeof(float);
  static constexpr uint32_t kDqBoxBytes = T::kDqRows * kBwdRowBytes;
  static constexpr int kBoxesPerDqSlab = kBwdSlabElems / kDqSlabFloats;  // in one 64-column slab of dQ
  static constexpr int kDqBoxesPerWarpgroup = T::kDqCols / kDqSlabFloats;
  static constexpr int kDqBoxes = T::kWarpgroups * kDqBoxesPerWarpgroup;  // of a block
  struct DqStaging {
    alignas(kBwdAtomBytes) float slab[T::kDqBuffers][kDqBoxes][T::kDqRows * kDqSlabFloats];
  };
  struct PtBuffers {
    alignas(kBwdAtomBytes) Element buf[2][T::kBlockN * T::kBlockM];
  };
  std::conditional_t<T::kDqStaged, DqStaging, PtBuffers> scratch;
  // The bytes the producer's TMA loads deliver: a query block's Q (or dO) tile, the CTA's K (or
  // V) tile, a query block's lse2 (or delta) row.
  static constexpr uint32_t kQueryTileBytes = T::kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKeyTileBytes = T::kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kRowBytes = T::kBlockM * sizeof(float);
  StageRows rows[T::kStages];
  // k_full, v_full, q_full: the producer's loads landed (its one arrival, with their bytes); q_empty:
  // every compute thread is done with the stage (its wgmmas completed, its lse2 and delta read;
  // one arrival each), at d256 the writer's reductions have read the dQ staged in it (1);
  // dq_full: every compute warp staged its dQ share in the buffer (8); dq_empty: the reductions
  // read the buffer (1); dq_in_stage (d256 only, no bytes elsewhere): every compute thread staged
  // its dQ share in the stage and read its lse2 and delta (one arrival each).
  uint64_t k_full, v_full;
  uint64_t q_full[T::kStages], q_empty[T::kStages];
  uint64_t dq_full[T::kDqBuffers], dq_empty[T::kDqBuffers];
  struct NoBarriers {};
  [[no_unique_address]] std::conditional_t<T::kDqInStage, uint64_t[T::kStages], NoBarriers> dq_in_stage;

  // d256 (kDqInStage): the shared address of box `box` of a block's dQ (columns 32 box..) staged
  // in stage s. A box is [64 rows][32 floats] with the 128-byte swizzle, the bytes of a Q/dO
  // slab. Warpgroup w's boxes, 4w..4w+3, go to the Q and dO slabs of its own columns (2w,
  // 2w + 1), which after the block's S^T and dP^T only its own dK and dV read: its first dQ
  // slab's two boxes to Q's, its second's to dO's.
  __device__ __forceinline__ uint32_t dq_box_in_stage(int s, int box) const {
    static_assert(!T::kDqInStage || (T::kColumns == 2 * kBwdSlabElems && T::kDqRows == T::kBlockM &&
                                     kDqBoxBytes * kBoxesPerDqSlab == T::kColumns * T::kBlockM * sizeof(Element)),
                  "a warpgroup's two dQ slabs fill its halves of the Q and dO tiles");
    const int w = box / kDqBoxesPerWarpgroup, i = box % kDqBoxesPerWarpgroup;
    const Element* tile = i < kBoxesPerDqSlab ? stage[s].q : stage[s].dout;
    return ptx::smem_addr(tile) + (w * kBoxesPerDqSlab + i % kBoxesPerDqSlab) * kDqBoxBytes;
  }
};

}  // namespace fusedattn::cuda::sm90
