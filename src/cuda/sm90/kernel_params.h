// What the Hopper forward kernel receives (by value, as a __grid_constant__ parameter): the four
// TMA descriptors, the API's parameter block, and the run-time switches of the ablation study.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/column_summary.h"
#include "cuda/common/tail_shares.h"
#include "cuda/sm90/row_packing.h"
#include "cuda/sm90/trace.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm90 {

// How far (log2 units) a KV block's row max may exceed the running max before the running max
// (and with it O) is rescaled: probabilities then reach up to 2^slack, which fp16/bf16 P and the
// fp32 sums hold with the same relative precision as values <= 1 (fp16 overflows only past 2^15).
// 0 is the textbook online softmax.
constexpr float kDefaultRescaleSlack = 8.f;
constexpr float kMaxRescaleSlack = 12.f;
// The largest probability OnlineSoftmax::update_in_place_unless_moved takes a block max from
// (2^64: its reciprocal stays a normal float with room to spare); a row whose max jumped further
// needs its scores again.
constexpr float kRebaseLimit = 0x1p64f;

// Optimisations that can be turned off at run time (read from the environment on the host by
// fwd_launch.cuh) so docs/hopper.md can record what each one buys.
struct Features {
  int num_stages = 2;      // K ring depth in use (1 .. compiled kStages), the V ring's too where equal
  int num_v_stages = 2;    // V ring depth in use where compiled deeper (num_stages .. kVStages)
  bool pingpong = true;    // the consumer warpgroups take turns (round robin) issuing their GEMMs
  bool overlap = true;     // Q*K^T of block n-1 is issued before the softmax of block n
  bool persistent = true;  // one CTA per SM walking tiles; off: one CTA per tile
  bool dynamic = true;     // persistent CTAs take tiles from an atomic counter (else round robin)
  bool early_k_release = true;  // a stage's K goes back to the producer once S is done, not with V
  bool narrow_first = true;     // a slice's first block at half width where it sees only that half
  // Where the instance has KernelConfig::kStagesOInKV: Q given back after the last Q K^T and O
  // staged in the last block's K/V stage. Only with the overlapped loop (the host clears it
  // otherwise).
  bool o_in_kv = true;
  // With o_in_kv: the wait for O's TMA store to leave the stage (and the producer's go-ahead to
  // refill it) behind the next tile's first Q K^T issue rather than in the epilogue.
  bool defer_o_read = true;
  float rescale_slack = kDefaultRescaleSlack;  // see OnlineSoftmax::update
  // Unmasked steps try the softmax without the row max first (OnlineSoftmax::update_unless_moved
  // into the second P buffer, update_in_place_unless_moved over S: Consumer::kSumCheckInPlace;
  // 0: off); its bound on a block's partial row sum, 2^rescale_slack.
  float sum_limit = 0.f;
  // Over S, the largest probability a failed check may rebase the block from (kRebaseLimit; 0:
  // none, every failed check computes the scores again).
  float rebase_limit = kRebaseLimit;
  // Q buffers in use (1 .. compiled kQBuffers). 2: the producer loads the next tile's Q (and its
  // first K/V) while the consumers still work on this tile, and the wait for O's TMA store to
  // leave its staging buffer moves behind the next tile's first GEMM issue. 1: each tile's Q
  // waits for the previous tile's O store.
  int q_buffers = 1;
};

// The high words of the wgmma shared-memory descriptors (stride byte offset and swizzle,
// ptx::desc_high_word), one per operand. They are compile-time constants, yet passed in: a
// constant high word is re-materialised by ptxas before every wgmma (UMOVs per k-step), while
// a value it cannot fold stays in the register of its descriptor pair. One word per operand
// because a word shared by the Q, K and V pairs is copied into each pair per k-step.
struct DescriptorHighWords {
  uint32_t q, k, v;
};

// The work list of a full-mask launch whose last wave is split (fwd_split.h): work items
// [0, plan.whole) are the tiles [0, plan.whole) run whole; item plan.whole + j is share j of the
// tail tiles after them (cuda/common/tail_shares.h), run as the segments the scheduler decodes,
// each a part of one tile. Each part writes its normalised O rows and LSE to its slot of the
// workspace; the last part of a slice to take its ticket combines every part (split_combine.cuh).
// plan.shares == 0: every item is a whole tile (masked launches, FUSEDATTN_SM90_TAIL_SPLIT=0).
struct SplitParams {
  TailShares plan;  // plan.items(): what the scheduler hands out
  int* tickets;  // [split tile][kMaxConsumerWarpgroups], zero at launch and left at zero
  float* lse;    // [split tile][plan.max_parts][block_m]
  float* o;      // [split tile][plan.max_parts][block_m x head_dim], in the accumulator's thread order
};

struct KernelParams {
  // Q and O as [batch, heads_q / group, seqlen_q, group, head_dim] (group = 2^packing.shift query
  // heads per tile head, row_packing.h), so a box of whole positions is a tile's (or a warpgroup
  // slice's) tiled rows in order; unpacked, group = 1. Boxes 64 x kQSlotRows (Q) and 64 x 64 rows (O).
  // Variable-length batches: batch 1 and the rows the sequences use (FwdParams::varlen_rows_*).
  CUtensorMap tma_q;
  CUtensorMap tma_k;  // [batch, seqlen_k, heads_kv, head_dim], box 64 x kBlockN
  CUtensorMap tma_v;
  CUtensorMap tma_o;  // each consumer warpgroup stores its own rows (o_one_box: in one request)
  FwdParams p;
  int num_m_blocks;
  RowPacking packing;  // GQA packing: which query head and position a tiled row is
  int schedule_shift;  // log2 of the (head, batch) pairs per group of the tile order (cuda/common/schedule.h)
  // tma_o stores a warpgroup's whole slice as one box (make_slab_tensor_map,
  // Epilogue::kOneBoxStaging); else one box per slab. A run-time switch like those in Features,
  // but here, in the padding before tile_counter: a field added to Features moves every later
  // parameter, and ptxas then allocated kernels that never read it differently (docs/hopper.md,
  // session 74).
  bool o_one_box = false;
  // Slices whose rows in use fit in the first 8 of each warp's 16 (decode steps) run the softmax on
  // each thread's first row only, where the instance compiles that loop (Consumer::kOneRowCopy;
  // FUSEDATTN_SM90_ONE_ROW). Here for the same reason as o_one_box.
  bool one_row = true;
  // Such slices split each block's keys over the warpgroup's warps, by warp-level MMAs, where the
  // instance compiles that loop (Consumer::kWarpSplitCopy; FUSEDATTN_SM90_WARP_SPLIT). Here for
  // the same reason as o_one_box.
  bool warp_split = true;
  int* tile_counter;  // zero at launch; null: static schedule
  SplitParams split;
  Features features;
  DescriptorHighWords desc_high;  // every field ptx::desc_high_word(ptx::kSwizzleAtomBytes)
  // MaskKind::kColumn: the mask's summary over kBlockN-key blocks (sm90/column_mask.cuh), which
  // the launcher writes on the stream before the kernel; empty for the other kinds.
  ColumnSummary columns;
  // A clustered launch's first work item, where two launches share the work list (fwd_launch.cuh,
  // launch_quad_mix); 0 otherwise. Last, so that no other field moves (see o_one_box).
  int item_offset = 0;
#ifdef FUSEDATTN_SM90_TRACE
  TraceBuffer trace;  // the tile-boundary trace's stamps (trace.cuh); only in a trace build
#endif

  // The batch coordinate of sequence b in the tensor maps: a variable-length batch is one
  // packed sequence of rows to the TMA (its tiles add the sequence's first row, WorkTile).
  FUSEDATTN_HD int map_batch(int b) const { return p.cu_seqlens_q != nullptr ? 0 : b; }
  // Element offsets of a query row's O row and LSE (q from RowPacking::query_row): the epilogue,
  // its row-by-row store and the split combine all write through these.
  FUSEDATTN_HD int64_t o_offset(int batch, QueryRow q) const {
    return int64_t{map_batch(batch)} * p.o_stride.batch + q.position * p.o_stride.row + q.head * p.o_stride.head;
  }
  FUSEDATTN_HD int64_t lse_offset(int batch, QueryRow q) const {
    return batch * p.lse_batch_stride + q.head * p.lse_head_stride + q.position;
  }
};

}  // namespace fusedattn::cuda::sm90
