// A consumer warpgroup's mainloop for one tile: its 64 query rows against every visible KV block,
// highest block first (so a causal tile starts with its masked diagonal block), or lowest first
// (TileMask::kAscending). Per block:
// S = Q K^T (wgmma, both operands in shared memory), mask on boundary blocks, online softmax,
// O += P V (wgmma, P from registers). With `overlap` the Q K^T of the next block is issued
// together with the P V of the current one, so the softmax of block n-1 runs while the tensor
// cores finish P V of block n. With `pingpong` the two warpgroups take turns issuing, so one's
// softmax hides under the other's GEMMs.
// Under a column mask (MaskKind::kColumn) the loop takes the tile's seen blocks only, which the
// announcement counts; each block's index and cut bit come with its K stage (ColumnTag,
// column_mask.cuh), read once its K has landed, and a block's `n` below is then that tag.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm90/column_mask.cuh"
#include "cuda/sm90/kernel_params.h"
#include "cuda/sm90/mask.cuh"
#include "cuda/sm90/named_barriers.h"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/shared_storage.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/tile_announcement.cuh"
#include "cuda/sm90/trace.cuh"
#include "cuda/sm90/warp_scores.cuh"
#include "cuda/sm90/warp_split.cuh"

namespace fusedattn::cuda::sm90 {

// Turn-taking between the consumer warpgroups, round robin (0, 1, .., count - 1, 0, ..): wait
// for my turn before issuing GEMMs, hand it to the next warpgroup right after issuing them. Each
// bar.sync of one warpgroup pairs with one bar.arrive of its predecessor (128 + 128 threads).
// Every warpgroup of a CTA works on the same tiles and issues the same number of times, so the
// ring never gets out of step.
struct WarpgroupTurns {
  bool enabled;
  int warpgroup;
  int count;  // consumer warpgroups in the ring
  static constexpr uint32_t kThreads = 2 * kWarpgroupThreads;
  __device__ __forceinline__ void wait_turn() const {
    if (enabled) ptx::named_barrier_sync(barrier_id(NamedBarrier::kTurn, warpgroup), kThreads);
  }
  __device__ __forceinline__ void pass_turn() const {
    const int next = warpgroup + 1 == count ? 0 : warpgroup + 1;
    if (enabled) ptx::named_barrier_arrive(barrier_id(NamedBarrier::kTurn, next), kThreads);
  }
};

// Whether masked tiles of 128-key blocks drop the second P buffer (Consumer::kDoubleP). A
// compile-time ablation switch: -DFUSEDATTN_SM90_MASKED_ONE_P=0 builds them with two, as before
// session 41.
#ifndef FUSEDATTN_SM90_MASKED_ONE_P
#define FUSEDATTN_SM90_MASKED_ONE_P 1
#endif
inline constexpr bool kMaskedOneP = FUSEDATTN_SM90_MASKED_ONE_P != 0;

// Whether the instances that may compile the one-row loop do (Consumer::kOneRowCopy). A
// compile-time ablation switch: -DFUSEDATTN_SM90_ONE_ROW_COPY=0 builds them without the copy, as
// before session 96, so that tools/ab_build.sh can time the prefill tiles that never enter it.
#ifndef FUSEDATTN_SM90_ONE_ROW_COPY
#define FUSEDATTN_SM90_ONE_ROW_COPY 1
#endif

// Whether the decode kernels (tile_config.h, decode_tile) compile the warp-split loop for those
// slices (Consumer::kWarpSplitCopy, warp_split.cuh). A compile-time ablation switch like the one
// above: -DFUSEDATTN_SM90_WARP_SPLIT_COPY=0 builds them without it.
#ifndef FUSEDATTN_SM90_WARP_SPLIT_COPY
#define FUSEDATTN_SM90_WARP_SPLIT_COPY 1
#endif

template <typename Element, class Cfg, MaskKind kMask>
struct Consumer {
  using Storage = SharedStorage<Element, Cfg>;
  using KVRing = KVRingState<Cfg>;
  static constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kHeadDim = Cfg::kHeadDim;
  static constexpr bool kInCluster = Cfg::kClusterCtas > 1;  // descriptors mask their addresses (ptx::desc_low_word)
  static constexpr int kSAcc = kWarpgroupRows * kBlockN / kWarpgroupThreads;    // S floats per thread
  static constexpr int kOAcc = kWarpgroupRows * kHeadDim / kWarpgroupThreads;   // O floats per thread
  static constexpr int kPRegs = kSAcc / 2;                                      // P as packed pairs
  static constexpr int kWarpRows = kWarpgroupRows / kWarpsPerWarpgroup;         // a warp's rows of S
  static constexpr int kKStep = 16;                                             // wgmma K per instruction
  static constexpr uint32_t kRowBytes = kSwizzleBytes;
  static constexpr uint32_t kKStepBytes = kKStep * sizeof(Element);  // next 16 columns of a K-major slab
  static constexpr int kKStepsPerSlab = Cfg::kSlabCols / kKStep;
  // K-major 128B-swizzled operands: 8-row groups are one atom (1024 bytes) apart; LBO is unused
  // and encoded as 1 (16 bytes).
  static constexpr uint32_t kUnusedLbo = 16;

  const KernelParams& params;
  Storage& smem;
  int warpgroup;  // 0 .. Cfg::kConsumerWarpgroups - 1: rows [64 warpgroup, 64 warpgroup + 64) of the tile
  int lane;
  int warp;  // within the warpgroup

  int q_stage = 0;        // the Q slot of the current tile that holds this warpgroup's rows
  uint32_t q_parity = 0;  // the phase of its q_full barrier that brings the tile's Q

  // The tile is announced apart from its Q (tile_announcement.cuh): begin_tile takes its Q slot
  // from ring, and wait_q waits for its Q right before the first GEMM, so the set-up between
  // the two runs while Q is still loading. Every path through a tile waits, also one that never
  // reads Q: the epilogue may stage O in the slot the load writes.
  __device__ __forceinline__ void begin_tile(const TileRing& ring) {
    const QSlot slot = q_slot<Cfg>(ring, warpgroup, params.features);
    q_stage = slot.index;
    q_parity = slot.phase;
  }
  __device__ __forceinline__ void wait_q() const {
    ptx::mbarrier_wait(&smem.q_full[q_stage], q_parity);
    stamp(TraceEvent::kQReady);
  }

  float o[kOAcc];
  OnlineSoftmax softmax;

  // The current tile's Q slot in shared memory, and this warpgroup's first row in it.
  __device__ __forceinline__ const Element* q_tile() const { return smem.q[Cfg::kQSlots > 1 ? q_stage : 0]; }
  static constexpr int kQSlotRows = Cfg::kQSlotRows;
  __device__ __forceinline__ int q_first_row() const { return q_slot_first_row<Cfg>(warpgroup); }

  // S (64 x kN) = Q_wg (64 x d) K^T, over kHeadDim / 16 k-steps, for the first kN keys of the
  // block (kN < kBlockN: a narrow block, TileMask::kNarrowsFirstBlock). A k-step's descriptors
  // are the tiles' low words plus a constant (ptx::desc_low_word), with the operand's high word
  // from the kernel parameters (see DescriptorHighWords).
  template <int kN = kBlockN>
  __device__ __forceinline__ void issue_qk(float (&s)[kN / 2], int stage) const {
    // K's base is re-read per block (value_here): hoisted, its per-k-step descriptors stay live
    // across the loop. Q's, the same for every block of the tile, may be hoisted: with the high
    // words from the kernel parameters ptxas keeps its words in uniform registers (0 B spills at
    // every head dim; before, the hoisted descriptors spilled at d256).
    const uint32_t q_low =
        ptx::desc_low_word<kInCluster>(ptx::smem_addr(q_tile()) + q_first_row() * kRowBytes, kUnusedLbo);
    const uint32_t k_low =
        ptx::value_here(ptx::desc_low_word<kInCluster>(ptx::smem_addr(smem.k[stage]), kUnusedLbo));
    const uint32_t q_high = params.desc_high.q, k_high = params.desc_high.k;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / kKStep; ++kk) {
      const uint32_t offset = (kk % kKStepsPerSlab) * kKStepBytes;
      const int slab = kk / kKStepsPerSlab;
      const uint32_t q_step = static_cast<uint32_t>(ptx::desc_encode(slab * kQSlotRows * kRowBytes + offset));
      const uint32_t k_step = static_cast<uint32_t>(ptx::desc_encode(slab * kBlockN * kRowBytes + offset));
      ptx::wgmma_ss<Element, kN>(s, ptx::desc_from_words(q_low + q_step, q_high),
                                      ptx::desc_from_words(k_low + k_step, k_high), kk > 0);
    }
  }

  // O (64 x d) += P (64 x kBlockN, registers) V (kBlockN x d). V is stored [key][d] in 64-column
  // slabs: for wgmma that is B N-major, 64-column groups kBlockN rows apart (LBO), 8-key groups
  // one atom apart (SBO); each k-step moves 16 keys down.
  __device__ __forceinline__ void issue_pv(const uint32_t (&p)[kPRegs], int stage) {
    const uint32_t v_low =
        ptx::value_here(ptx::desc_low_word<kInCluster>(ptx::smem_addr(smem.v[stage]), kBlockN * kRowBytes));
    const uint32_t v_high = params.desc_high.v;
#pragma unroll
    for (int kk = 0; kk < kBlockN / kKStep; ++kk) {
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      const uint32_t v_step = static_cast<uint32_t>(ptx::desc_encode(kk * kKStep * kRowBytes));
      ptx::wgmma_rs<Element, kHeadDim>(o, a, ptx::desc_from_words(v_low + v_step, v_high), true);
    }
  }

  // The softmax output as the A operand of P V: k-step kk takes accumulator chunks 2kk, 2kk+1.
  // A narrow block's S (its first kAcc registers) leaves P 0 for the keys it did not compute.
  // Pair i is row i % 2's (OnlineSoftmax: columns 4j + 2r, +1 of row r are pair 2j + r); with one
  // live row the second row's pairs are left as they are (zeroed_second_rows).
  template <int kLive = OnlineSoftmax::kRows, int kAcc>
  __device__ __forceinline__ static void convert_p(const float (&s)[kAcc], uint32_t (&p)[kPRegs]) {
    static_assert(kAcc <= kSAcc && kAcc % 2 == 0);
#pragma unroll
    for (int i = 0; i < kPRegs; ++i)
      if (i % 2 < kLive) p[i] = 2 * i < kAcc ? pack2<Element>(s[2 * i], s[2 * i + 1]) : 0u;
  }

  // Whether a slice runs the one-row loop (kOneRowCopy): its rows in use all lie in the first half
  // of every warp's rows. Uniform over the warpgroup: every warp reads the same announced slice.
  static constexpr int kHalfWarpRows = kWarpRows / 2;  // a thread's second row is 8 below its first
  __device__ __forceinline__ bool one_row_slice(const AnnouncedTile& t) const {
    return params.one_row &&
           params.packing.rows(int64_t{t.slice.len_q}) - t.slice.first_row <= kHalfWarpRows;
  }

  // Whether a one-row slice runs the warp-split loop (kWarpSplitCopy). Not a second warpgroup's
  // where V rows past the sequence hold the cache's values (loads_unwritten_rows): warpgroup 0
  // zeroes them (clear_unused_v_rows) after handing on its first turn, so the GEMM turns order
  // that before the other warpgroups' P V, but not before this loop's reads of V, which follow
  // the turn before the block's.
  __device__ __forceinline__ bool warp_splits() const {
    return params.warp_split && (warpgroup == 0 || !loads_unwritten_rows(params.p));
  }

  // The second rows' pairs of P, which a one-row loop never writes, held at 0, so O's second rows
  // stay 0 (finite: P V's rows are independent, and the epilogue stores none of them).
  template <int kBuffers>
  __device__ __forceinline__ static void zeroed_second_rows(uint32_t (&p)[kBuffers][kPRegs]) {
#pragma unroll
    for (int b = 0; b < kBuffers; ++b)
#pragma unroll
      for (int i = 1; i < kPRegs; i += 2) p[b][i] = 0u;
  }

  // The first kCount registers of S: a narrow block's accumulator. The view, like S, is indexed
  // with constants only, so it stays in S's registers.
  template <int kCount>
  __device__ __forceinline__ static float (&first_columns(float (&s)[kSAcc]))[kCount] {
    static_assert(kCount <= kSAcc);
    return *reinterpret_cast<float (*)[kCount]>(&s[0]);
  }

  using Mask = TileMask<kMask, kBlockM, kBlockN, Cfg::kClusterCtas>;
  // Registers per consumer thread (setmaxnreg, kernel.cuh): fewer under a column mask, whose
  // producer takes more (tile_config.h, kColumnProducerRegisters).
  static constexpr int kRegisters =
      kMask == MaskKind::kColumn ? Cfg::kColumnConsumerRegisters : Cfg::kConsumerRegisters;
  // Registers of S, P and O, which the overlapped loop holds throughout.
  static constexpr int kSinglePAccumulators = kSAcc + kPRegs + kOAcc;
  // Whether the overlapped loop is compiled at all: beside its accumulators it needs 32 registers
  // (the 192-row tile runs on that); with 24 (two CTAs per SM, kD64Pair) ptxas serialises every
  // wgmma of the kernel, so there the launch turns the overlap off (features.overlap).
  static constexpr int kOverlapHeadroomRegisters = 32;
  static constexpr bool kOverlaps = kRegisters - kSinglePAccumulators >= kOverlapHeadroomRegisters;
  // Whether the loop without the overlap skips the blocks a slice does not see (as the overlapped
  // one does): only where it is the only loop (kD64Pair). In the overlapping tiles it is the
  // switch-off path, which computes those blocks fully masked instead: skipping there serialised
  // the 192-row tile's wgmmas (C7511).
  static constexpr bool kSkipsAlone = Mask::kSlicesSkipBlocks && !kOverlaps;
  // Headroom the masked overlapped step needs besides the accumulators: 32 spilled 124-144 B,
  // d256's 52 did not.
  static constexpr int kMaskHeadroomRegisters = 48;
  // A second P buffer: the next block's P is converted while P V still reads this one, so
  // nothing but the wait sits between P V's end and the next GEMM issue; only where the masked
  // step keeps its headroom beside it (d64 128-row tile, d96, d128, the 64-key d192/d256 tiles).
  // See docs/hopper.md, session 7. The loop is then unrolled by two, so under a mask, where each
  // step has a masked and an unmasked copy, four step copies: the d128 causal kernel missed the
  // instruction cache 5x as often per instruction as the full one, at the jumps over the rarely
  // taken paths inside its unmasked step (ncu, session 41). Masked tiles of 128-key blocks keep
  // one buffer (SASS 8792 -> 6704 instructions; on the H200 d96 causal 2k +2%, d128 2k/4k +1%,
  // d64 level, sessions 41-42); the 64-key tiles, whose steps are half as long, ran 0.5-1% slower
  // with one and keep two.
  static constexpr int kMaskedOnePMinKeys = 128;
  static constexpr bool kDoubleP =
      kRegisters - (kSinglePAccumulators + kPRegs) >= kMaskHeadroomRegisters &&
      !(kMask != MaskKind::kFull && kBlockN >= kMaskedOnePMinKeys && kMaskedOneP);
  static constexpr int kPBuffers = kDoubleP ? 2 : 1;
  static constexpr int kAccumulatorRegisters = kSinglePAccumulators + (kPBuffers - 1) * kPRegs;
  // Whether a cut block's mask may run while P V is in flight, i.e. beside S, P and O: with 240
  // registers per thread (d128: 160 of accumulators with one P buffer, d256: 188) it fits;
  // with 160 (the 192-row d64 tile: 128 of accumulators) its row bounds and compares spilled, so
  // there the cut blocks wait for P V first.
  static constexpr bool kMaskBesidePV = kRegisters - kAccumulatorRegisters >= kMaskHeadroomRegisters;
  // Whether the unmasked step's sum check writes the probabilities over S (rebased from them when
  // a row moved, S computed again on overflow: OnlineSoftmax::update_in_place_unless_moved) rather
  // than into the second P buffer with S kept for update(). With one P buffer it must. With two,
  // under masks: a row's first whole block after the cut diagonal fails the check in most warps,
  // and the rebase is cheaper than update()'s second pass of exponentials (d128 causal 1k +5%,
  // 4k-8k +1-3%); full masks rarely fail it and lost 2-3% to converting P after the check
  // (docs/hopper.md, session 23).
  static constexpr bool kSumCheckInPlace = !kDoubleP || kMask != MaskKind::kFull;
  static_assert(kSumCheckInPlace || kMaskBesidePV, "the check into the second P buffer runs beside P V");
  // Slices whose rows in use all lie in the first half of every warp's rows (one_row_slice): a
  // decode step's packed GQA group of up to 8 query heads, or one query of up to 8 heads. Their
  // softmax has only each thread's first row to compute (OnlineSoftmax, kLive), on the critical
  // path where the other warpgroup, which has no rows, hides nothing under its GEMMs. They run a
  // second copy of the overlapped loop, compiled into unclustered full-mask tiles of two consumer
  // warpgroups (decode steps run those; the prefill grid's tiles never enter it, and their loop
  // keeps its code) that have the registers for a second P buffer: d256's 80-key tile (one P
  // buffer, 52 registers beside the accumulators) spilled 168 B with it.
  static constexpr bool kOneRowCopy = FUSEDATTN_SM90_ONE_ROW_COPY != 0 && kMask == MaskKind::kFull && !kInCluster &&
                                      kDoubleP && Cfg::kConsumerWarpgroups == 2 && Cfg::kCtasPerSm == 1;
  // The same slices may instead split each block's keys over the warpgroup's four warps, by
  // warp-level MMAs on the slice's first 16 rows (warp_split.cuh, KernelParams::warp_split): a
  // step's tensor work shrinks from the 64 rows of the wgmma to 16, and no warp waits for another
  // until the tile's end.
  // Up to d192: at d256 (the 64-key tile, O 128 registers) the kernel spilled 540 B with it, still
  // 552 B with Q's rows read at each k-step rather than held, 120 B without the merge. Only in
  // the decode steps' kernels (tile_config.h, decode_tile): the prefill kernels ran ~1% slower
  // with the loop compiled in, though they never enter it.
  using Split = WarpSplit<Element, Cfg>;
  static constexpr int kWarpSplitMaxHeadDim = 192;
  static constexpr bool kWarpSplitCopy =
      kOneRowCopy && FUSEDATTN_SM90_WARP_SPLIT_COPY != 0 && kHeadDim <= kWarpSplitMaxHeadDim && Cfg::kShape.decode;
  // Where the registers left beside the accumulators allow (the d64 128-row tile: 80; d128 with
  // its second P buffer, full masks: 48; d256: 52), the tile and the mask's per-tile facts stay
  // in registers: 0 B spills, and the epilogue saves re-reading the announcement (d128 full
  // +1-1.5% on the H200, docs/hopper.md session 19). Otherwise (the 192-row tile: 32 left) the
  // facts (the slice's first row, which blocks are cut) wait in shared memory, one copy per warp
  // written by its lane 0 and read back in the blocks that need them, and the epilogue looks the
  // tile up again: carried at 160 registers, they spilled.
  static constexpr int kCarryHeadroomRegisters = 48;
  static constexpr bool kCarryTileState = kRegisters - kAccumulatorRegisters >= kCarryHeadroomRegisters;
  MaskedSlice carried_slice;  // kCarryTileState only

  __device__ __forceinline__ const MaskedSlice& slice() const {
    if constexpr (kCarryTileState) return carried_slice;
    else return smem.slice[warpgroup * kWarpsPerWarpgroup + warp];
  }

  __device__ __forceinline__ void publish_slice(const MaskedSlice& facts) {
    if constexpr (kCarryTileState) {
      carried_slice = facts;
    } else {
      __syncwarp();  // the lanes' reads of the previous tile's copy are done
      if (lane == 0) smem.slice[warpgroup * kWarpsPerWarpgroup + warp] = facts;
      __syncwarp();
    }
  }

  // Column masks: this thread's (batch, query head)'s mask, set per tile; the other kinds hold
  // nothing here.
  static constexpr bool kColumns = kMask == MaskKind::kColumn;
  struct NoColumnMask {};
  [[no_unique_address]] std::conditional_t<kColumns, ColumnMaskView, NoColumnMask> column_mask;

  // Block n's index: n itself, or under a column mask the index in n's tag.
  __device__ __forceinline__ static int block_index(int n) {
    if constexpr (kColumns) return ColumnTag::block(n);
    else return n;
  }

  // Whether block n needs the element-wise mask: the window cuts it, or (column masks) the tag says
  // the column mask does.
  __device__ __forceinline__ bool cuts(int n) const {
    if constexpr (kColumns) return ColumnTag::cut(n) || Mask::cuts(slice().uncut, block_index(n));
    else return Mask::cuts(slice().uncut, n);
  }

  // The block the loop takes at kv as the mask steps name it: the loop's own n, or under a column
  // mask the stage's tag, read once its K has landed (the caller's later wait for it then passes at
  // once) and before this warp gives the K back (the producer rewrites the tag only after that).
  __device__ __forceinline__ int block_at(int n, const KVRing& kv, const KVPipeline<Storage>& pipe) const {
    if constexpr (kColumns) {
      pipe.consumer_wait_k(kv);
      return read_column_tag(smem.column_tag[kv.k().stage()], lane);
    } else {
      return n;
    }
  }

  // Masks block n of S (or a narrow block's first columns) outside this thread's two rows' keys.
  // Under a column mask the window's mask where the window cuts the block (documents shorter than a
  // tile have most blocks cut by the column mask alone; the window's mask on all of them took 12% of
  // the short documents' stall samples, session 54), then the column mask's where the tag says it cuts.
  template <int kAcc>
  __device__ __forceinline__ void apply_mask(float (&s)[kAcc], int n) const {
    const MaskedSlice& facts = slice();
    const Mask mask{params.p, params.packing, facts.len_q, facts.len_k};
    const int64_t row0 = int64_t{facts.first_row} + warp * 16 + lane / 4;
    const int block = block_index(n);
    if (!kColumns || Mask::cuts(facts.uncut, block)) {
      if (mask.left_bounded()) {
        const typename Mask::Bounds rows[2] = {mask.bounds_of_row(row0), mask.bounds_of_row(row0 + 8)};
        Mask::apply(s, block, rows, 2 * (lane % 4));
      } else {
        const int row_hi[2] = {mask.right_bound_of_row(row0), mask.right_bound_of_row(row0 + 8)};
        Mask::apply_right(s, block, row_hi, 2 * (lane % 4));
      }
    }
    if constexpr (kColumns) {
      // Rows are query positions (column masks run unpacked) and int32 like the keys.
      if (ColumnTag::cut(n))
        hide_column_scores<kBlockN, column_bounds_in_flight(Cfg::kCtasPerSm)>(
            s, params.p, column_mask, block, static_cast<int>(row0), 2 * (lane % 4), facts.len_k);
    }
  }

  // Scores to probabilities for KV block n: mask if the block is cut, then online softmax.
  template <int kLive = OnlineSoftmax::kRows, int kAcc>
  __device__ __forceinline__ void softmax_step(float (&s)[kAcc], int n, RowCorrection& correction) {
    if (cuts(n)) apply_mask(s, n);
    softmax.update<kLive>(s, params.p.scale_log2, params.features.rescale_slack, correction);
  }

  // A store still pending when the next tile starts is the previous tile's, which (two Q
  // buffers in use, or warpgroup 0's two slots: only then is the release deferred, see
  // PendingStore) took the other one.
  __device__ __forceinline__ int previous_q_buffer() const {
    if constexpr (Cfg::kWarpgroupQ) return warpgroup == 0 ? q_stage ^ 1 : q_stage;
    else return Cfg::kQBuffers > 1 ? q_stage ^ 1 : 0;
  }

  // The previous tile's O store, if still held, is waited for and its staging given back: the
  // Q slot, or with O staged in K/V (o_in_kv) the stage of that tile's last block, the one
  // before kv's (kv has not moved past this tile's first block yet where this is called).
  __device__ __forceinline__ void release_pending(PendingStore& pending, const KVRing& kv) const {
    if (stages_own_o_in_kv<Cfg>(params.features, warpgroup))
      pending.release_staged_o(smem, kv.k().previous_stage(params.features.num_stages), warpgroup);
    else
      pending.release(smem, previous_q_buffer());
  }

  // S = Q K^T of the block at kv (its first kN keys) with nothing else in flight: wait for its
  // K, issue in my turn, wait until S is in registers. The previous tile's O staging, if still
  // held, is released while this GEMM runs.
  template <int kN = kBlockN>
  __device__ __forceinline__ void qk_alone(float (&s)[kN / 2], const KVRing& kv, const WarpgroupTurns& turns,
                                           const KVPipeline<Storage>& pipe, PendingStore& pending) const {
    pipe.consumer_wait_k(kv);
    turns.wait_turn();
    stamp(TraceEvent::kFirstTurnTaken);
    ptx::wgmma_fence();
    issue_qk<kN>(s, kv.k().stage());
    ptx::wgmma_commit_group();
    turns.pass_turn();
    release_pending(pending, kv);
    ptx::wgmma_wait_group<0>();
    ptx::fence_operands(s);
    if (params.features.early_k_release) pipe.consumer_release_k(kv, lane);
  }

  // This warp's rows of S for the K stage, by warp-level MMAs (the warpgroup's wgmma cannot be
  // issued by one warp): the in-place sum-checked step's path for probabilities it cannot rebase
  // (kSumCheckInPlace, OnlineSoftmax::update_in_place_unless_moved), rare.
  __device__ __forceinline__ void rescore(float (&s)[kSAcc], int k_stage) const {
    warp_scores<Element, kHeadDim, kQSlotRows, kBlockN>(s, ptx::smem_addr(q_tile()), ptx::smem_addr(smem.k[k_stage]),
                                                        q_first_row() + warp * kWarpRows, lane);
  }

  // seqused_k and paged launches (loads_unwritten_rows): block n's V rows past the sequence's
  // keys hold whatever the caller's cache or page holds there (the TMA loads whole blocks; a
  // dense launch's maps end at seqlen_k and zero-fill instead). Their P is 0, but 0 * NaN is NaN,
  // so the first warpgroup to take the block's P V turn zeroes them first, whole 128-byte rows
  // (the swizzle only permutes chunks within a row); the others' P V turns come after its turn
  // (GEMM turns, which the launcher keeps on). Dispatch sends here only tiles whose warpgroups all
  // read every block, so that first one is warpgroup 0 (cuda/dispatch.cu, sm90_clears_unused_rows).
  __device__ __forceinline__ void clear_unused_v_rows(int n, const KVRing& kv, const KVPipeline<Storage>& pipe) const {
    // Column masks run dense calls only, whose maps zero-fill (and whose n is a tag here).
    if (kColumns || !loads_unwritten_rows(params.p) || warpgroup != 0) return;
    const int used = slice().len_k - n * kBlockN;
    if (used >= kBlockN) return;
    pipe.consumer_wait_v(kv);  // the TMA has written the block (waiting again later passes at once)
    constexpr int kChunkElems = 16 / static_cast<int>(sizeof(Element));
    constexpr int kRowChunks = Cfg::kSlabCols / kChunkElems;
    constexpr int kSlabElems = kBlockN * Cfg::kSlabCols;
    const int rows = kBlockN - used, chunks = Cfg::kSlabs * rows * kRowChunks;
    Element* stage = smem.v[kv.v().stage()];
    const int thread = ptx::thread_index_here() % kWarpgroupThreads;
    for (int i = thread; i < chunks; i += kWarpgroupThreads) {
      const int slab = i / (rows * kRowChunks), row = used + i / kRowChunks % rows, chunk = i % kRowChunks;
      *reinterpret_cast<uint4*>(stage + slab * kSlabElems + row * Cfg::kSlabCols + chunk * kChunkElems) =
          make_uint4(0, 0, 0, 0);
    }
    // Ordinary stores -> wgmma (async proxy) reads: fence in every writing thread, then meet.
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(barrier_id(NamedBarrier::kEpilogue, warpgroup), kWarpgroupThreads);
  }

  // The stage's V (and its K, unless that went right after S = Q K^T) back to the producer.
  __device__ __forceinline__ void release_after_pv(const KVRing& kv, const KVPipeline<Storage>& pipe) const {
    if (!params.features.early_k_release) pipe.consumer_release_k(kv, lane);
    pipe.consumer_release_v(kv, lane);
  }

  // O += P V of the block at kv with nothing else in flight; then the stage goes back to the
  // producer and kv moves on.
  __device__ __forceinline__ void pv_alone(const uint32_t (&p)[kPRegs], KVRing& kv, const WarpgroupTurns& turns,
                                           const KVPipeline<Storage>& pipe) {
    pipe.consumer_wait_v(kv);
    turns.wait_turn();
    ptx::wgmma_fence();
    issue_pv(p, kv.v().stage());
    ptx::wgmma_commit_group();
    turns.pass_turn();
    ptx::wgmma_wait_group<0>();
    ptx::fence_operands(o);
    release_after_pv(kv, pipe);
    kv.advance(params.features);
  }

  // One block of the overlapped loop: S of block n_next and O += P V of the current block are
  // issued together; the softmax of n_next runs while P V is still in flight. O takes the
  // previous softmax's correction between the two issues (it is idle there), so after the
  // final wait only P's conversion is left and nothing pulls that wait above the softmax.
  // p is P V's operand; the next block's P goes to p_next (the same buffer without kDoubleP).
  template <bool kMasked, int kLive>
  __device__ __forceinline__ void overlapped_step(float (&s)[kSAcc], uint32_t (&p)[kPRegs], uint32_t (&p_next)[kPRegs],
                                                  RowCorrection& correction, int n_next, KVRing& kv,
                                                  const WarpgroupTurns& turns, const KVPipeline<Storage>& pipe) {
    constexpr bool kWaitsForPV = kMasked && !kMaskBesidePV;
    constexpr bool kConvertsBeforeWait = kDoubleP && !kWaitsForPV;
    KVRing next = kv;
    next.advance(params.features);
    pipe.consumer_wait_k(next);
    pipe.consumer_wait_v(kv);
    turns.wait_turn();
    ptx::wgmma_fence();
    issue_qk(s, next.k().stage());
    ptx::wgmma_commit_group();
    apply_correction<kLive>(o, correction);
    ptx::wgmma_fence();
    issue_pv(p, kv.v().stage());
    ptx::wgmma_commit_group();
    turns.pass_turn();
    if constexpr (kWaitsForPV) {
      // The cut block waits for P V first, so P is dead while the mask runs. Only the few blocks
      // a window edge or the sequence end cuts take this path.
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(s);
      ptx::fence_operands(o);
      ptx::fence_operands(p);
      if (params.features.early_k_release) pipe.consumer_release_k(next, lane);
      release_after_pv(kv, pipe);
      apply_mask(s, n_next);
      softmax.update<kLive>(s, params.p.scale_log2, params.features.rescale_slack, correction);
    } else {
      ptx::wgmma_wait_group<1>();  // S ready; P V may still run
      ptx::fence_operands(s);
      // Unmasked blocks first try the softmax without the row max (softmax.cuh).
      if constexpr (kSumCheckInPlace) {
        // Over S: a warp whose rows' maxima moved too far to rebase computes its S again from K,
        // so K goes back only after the check.
        bool kept = false;
        if constexpr (!kMasked) {
          if (params.features.sum_limit > 0.f) {
            kept = softmax.update_in_place_unless_moved<kLive>(s, params.p.scale_log2, params.features.sum_limit,
                                                               params.features.rebase_limit, correction);
            if (!kept) rescore(s, next.k().stage());
          }
        }
        if (params.features.early_k_release) pipe.consumer_release_k(next, lane);
        if constexpr (kMasked) apply_mask(s, n_next);
        if (!kept) softmax.update<kLive>(s, params.p.scale_log2, params.features.rescale_slack, correction);
        if constexpr (kConvertsBeforeWait) convert_p<kLive>(s, p_next);
      } else {
        // Straight into the second P buffer, with S kept for update().
        if (params.features.early_k_release) pipe.consumer_release_k(next, lane);
        if constexpr (kMasked) apply_mask(s, n_next);
        bool packed = false;
        if constexpr (!kMasked) {
          packed = params.features.sum_limit > 0.f &&
                   softmax.update_unless_moved<Element, kLive>(s, p_next, params.p.scale_log2,
                                                               params.features.sum_limit, correction);
        }
        if (!packed) {
          softmax.update<kLive>(s, params.p.scale_log2, params.features.rescale_slack, correction);
          convert_p<kLive>(s, p_next);
        }
      }
      // Keeps ptxas from hoisting the wait above the softmax and, with two P buffers, the next
      // P's conversion below it (see ptx/wgmma.cuh); a launched kernel has batch >= 1, so the
      // anchoring stores never run.
      const bool never = params.p.batch == 0;
      if constexpr (kConvertsBeforeWait) {
        ptx::complete_before_wait(never, ptx::smem_addr(smem.q[0]), p_next, softmax.row_sum);
      } else {
        ptx::complete_before_wait(never, ptx::smem_addr(smem.q[0]), softmax.row_sum);
      }
      ptx::wgmma_wait_group<0>();
      ptx::fence_operands(o);
      ptx::fence_operands(p);
      release_after_pv(kv, pipe);
    }
    // With one P buffer only now: the P V just finished was reading the old p.
    if constexpr (!kConvertsBeforeWait) convert_p<kLive>(s, p_next);
    kv = next;
  }

  // One overlapped step, the masked or the unmasked copy (so the common unmasked one carries no
  // mask code, and its register pressure, at all).
  template <int kLive>
  __device__ __forceinline__ void kv_step(float (&s)[kSAcc], uint32_t (&p)[kPRegs], uint32_t (&p_next)[kPRegs],
                                          RowCorrection& correction, int n_next, KVRing& kv,
                                          const WarpgroupTurns& turns, const KVPipeline<Storage>& pipe) {
    if constexpr (kColumns) {
      // The cut bit comes with the next block's K, so the step is chosen only once that K has
      // landed (overlapped_step waits for it before its turn too, so no turn waits longer).
      KVRing next = kv;
      next.advance(params.features);
      n_next = block_at(n_next, next, pipe);
    }
    if (!Mask::kCutsOnlyFirstBlock && cuts(n_next))
      overlapped_step<true, kLive>(s, p, p_next, correction, n_next, kv, turns, pipe);
    else
      overlapped_step<false, kLive>(s, p, p_next, correction, n_next, kv, turns, pipe);
  }

  // Whether this warpgroup's 64 rows of tile t all lie past the sequence end (its tiled rows), as in a sequence's
  // partial last tile (2048 queries = 10 x 192 + 128 leave the last 192-row tile's third slice
  // empty). Uniform across the warpgroup: every warp reads the same announced first row. A
  // 32-bit compare, like the mask's: dispatch keeps seqlen_q within the TMA's int32 coordinates.
  __device__ __forceinline__ bool slice_is_empty(const AnnouncedTile& t) const {
    return t.slice.first_row >= static_cast<int>(params.packing.rows(int64_t{t.slice.len_q}));
  }

  // Whether tiles with KV blocks stage O in their last block's stage (KernelConfig::kStagesOInKV).
  __device__ __forceinline__ bool o_in_kv() const { return stages_o_in_kv<Cfg>(params.features); }

  // With o_in_kv, once this warpgroup's last Q K^T of a tile has completed (or, passing through,
  // at once): each warp gives the Q slot back, so the next tile's Q loads during this tile's
  // last P V and epilogue, and warpgroup 1 tells warpgroup 0 it has read the last block's K,
  // where warpgroup 0 stages its O (Epilogue::meet). With kWarpgroupQ warpgroup 0 stages its O
  // in its own slot: it keeps the slot, and needs no word from warpgroup 1.
  __device__ __forceinline__ void last_qk_done() const {
    if (!stages_own_o_in_kv<Cfg>(params.features, warpgroup)) return;
    if (lane == 0) ptx::mbarrier_arrive(&smem.q_empty[q_stage]);
    if (warpgroup == 1 && !Cfg::kWarpgroupQ)
      ptx::named_barrier_arrive(barrier_id(NamedBarrier::kKStageRead, 0), 2 * kWarpgroupThreads);
  }

  // One GEMM turn taken and handed on at once, by a warpgroup with nothing to issue.
  __device__ __forceinline__ static void pass_through_turn(const WarpgroupTurns& turns) {
    turns.wait_turn();
    turns.pass_turn();
  }

  // Tile t for a warpgroup whose slice is empty (slice_is_empty): no GEMM, softmax, mask or
  // store, but every synchronisation the others rely on. It takes as many GEMM turns as mma_tile
  // (with the overlap: Q K^T of the first block alone, then one per block, its P V beside the
  // next block's Q K^T; without: Q K^T and P V of each block), each handed on at once, so the
  // busy warpgroups get the tensor cores more often. Before a turn it waits for no stage that a
  // busy warpgroup would not have waited for by the same turn, so the ring cannot stall on it,
  // and it gives each stage back once that stage has arrived (an arrival on "empty" before the
  // "full" wait would count towards the stage's previous use).
  __device__ __forceinline__ void pass_through_tile(const AnnouncedTile& t, const TileRing& ring, KVRing& kv,
                                                    const WarpgroupTurns& turns, PendingStore& pending) {
    begin_tile(ring);
    wait_q();
    const KVPipeline<Storage> pipe{smem};
    const int count = t.blocks.count();
    release_pending(pending, kv);
    if (count > 0) last_qk_done();
    const bool overlap = params.features.overlap;
    const int turn_count = count == 0 ? 0 : overlap ? count + 1 : 2 * count;
    // One loop, so the turn has one call site here: with a second one ptxas re-allocated the
    // 128-row tile's unmasked step (+6 instructions); the skipping instances add pass_turns.
    for (int i = 0; i < turn_count; ++i) {
      // With the overlap, block i - 1 goes back before turn i > 0 (as in pass_turns); without, a
      // block's K before its Q K^T turn (even i) and its V before its P V turn (odd i).
      const bool frees_k = overlap ? i > 0 : i % 2 == 0;
      const bool frees_v = overlap ? i > 0 : i % 2 == 1;
      if (frees_k) {
        pipe.consumer_wait_k(kv);
        pipe.consumer_release_k(kv, lane);
      }
      if (frees_v) {
        pipe.consumer_wait_v(kv);
        pipe.consumer_release_v(kv, lane);
        kv.advance(params.features);
      }
      pass_through_turn(turns);
    }
  }

  // The block at kv given back unread once it has landed (a block this warpgroup skips).
  __device__ __forceinline__ void skip_block(KVRing& kv, const KVPipeline<Storage>& pipe) const {
    pipe.consumer_wait_k(kv);
    pipe.consumer_release_k(kv, lane);
    pipe.consumer_wait_v(kv);
    pipe.consumer_release_v(kv, lane);
    kv.advance(params.features);
  }

  // Turns [first, last) of a tile's overlapped schedule (count + 1 turns for count blocks: Q K^T
  // of the first block alone, then one per block, the last P V alone), taken by a warpgroup with
  // nothing to issue in them: before turn i > 0 block i - 1 of the tile's order goes back (a busy
  // warpgroup waits for block i's K there, which the producer loads later).
  __device__ __forceinline__ void pass_turns(int first, int last, KVRing& kv, const WarpgroupTurns& turns,
                                             const KVPipeline<Storage>& pipe) const {
    for (int i = first; i < last; ++i) {
      if (i > 0) skip_block(kv, pipe);
      pass_through_turn(turns);
    }
  }

  // Runs the whole KV loop of tile t (its Q in ring's buffer); leaves the unnormalised O in `o`
  // and the row statistics in `softmax`. kv is the consumer's position in the K/V ring, carried
  // across tiles; `pending` (the previous tile's O staging) is released behind the first GEMM.
  __device__ __forceinline__ void mma_tile(const AnnouncedTile& t, const TileRing& ring, KVRing& kv,
                                           const WarpgroupTurns& turns, PendingStore& pending) {
    begin_tile(ring);
    const KVPipeline<Storage> pipe{smem};
    const KVBlockRange blocks = t.blocks;
    publish_slice(t.slice);
    if constexpr (kColumns) column_mask = ColumnMaskView::of(params.p, params.columns, t.tile.batch, t.tile.head);
#pragma unroll
    for (int i = 0; i < kOAcc; ++i) o[i] = 0.f;
    softmax.reset();
    if (blocks.count() == 0) {
      wait_q();
      release_pending(pending, kv);
      return;
    }

    if (kOverlaps && params.features.overlap) {
      if constexpr (!Mask::kSlicesSkipBlocks) {
        if constexpr (kOneRowCopy) {
          if (one_row_slice(t)) {
            if constexpr (kWarpSplitCopy) {
              if (warp_splits()) {
                warp_split_blocks(blocks, kv, turns, pipe, pending);
                return;
              }
            }
            overlapped_blocks<1>(blocks, t.narrow_first, kv, turns, pipe, pending);
            return;
          }
        }
        overlapped_blocks(blocks, t.narrow_first, kv, turns, pipe, pending);
        return;
      }
      // Blocks of the tile that none of this slice's rows sees (above or below t.visible) are
      // skipped: their turns pass at once, their stages go back unread.
      const KVBlockRange mine = t.visible;
      const int count = blocks.count(), before = Mask::blocks_before(blocks, mine), mine_count = mine.count();
      if (mine_count == 0) {  // its rows see no key of the tile: out 0, lse -inf
        pass_through_tile(t, ring, kv, turns, pending);
        return;
      }
      // A deferred staging goes back before the slice waits for blocks it skips: the producer
      // may refill that stage for one of them (FUSEDATTN_SM90_DEFER_O_READ).
      if (before > 0) release_pending(pending, kv);
      pass_turns(0, before, kv, turns, pipe);
      if (before > 0) skip_block(kv, pipe);
      overlapped_blocks(mine, t.narrow_first, kv, turns, pipe, pending);
      pass_turns(before + mine_count + 1, count + 1, kv, turns, pipe);
      return;
    }
    // Without the overlap: Q K^T, softmax and P V of each block alone, in the tile's block order.
    KVBlockRange mine = blocks;
    if constexpr (kSkipsAlone) {
      // Blocks none of this slice's rows sees (above or below t.visible) pass their two turns at
      // once and go back unread.
      mine = t.visible.count() > 0 ? t.visible : KVBlockRange{blocks.hi, blocks.hi};
      skip_blocks_alone(Mask::blocks_before(blocks, mine), kv, turns, pipe, pending);
    }
    wait_q();
    float s[kSAcc];
    uint32_t p[kPRegs];
    RowCorrection correction;
    for (int n = Mask::first_block(mine); Mask::block_in_loop(mine, n); n = Mask::next_block(n)) {
      const int block = block_at(n, kv, pipe);
      qk_alone(s, kv, turns, pipe, pending);
      softmax_step(s, block, correction);
      apply_correction(o, correction);
      convert_p(s, p);
      clear_unused_v_rows(n, kv, pipe);
      pv_alone(p, kv, turns, pipe);
    }
    if constexpr (kSkipsAlone)
      skip_blocks_alone(blocks.count() - Mask::blocks_before(blocks, mine) - mine.count(), kv, turns, pipe, pending);
  }

  // `count` blocks of the loop without the overlap given back unread, each once it has landed (as
  // in pass_through_tile), their two turns each passed at once.
  __device__ __forceinline__ void skip_blocks_alone(int count, KVRing& kv, const WarpgroupTurns& turns,
                                                    const KVPipeline<Storage>& pipe, PendingStore& pending) const {
    for (int i = 0; i < count; ++i) {
      release_pending(pending, kv);
      pipe.consumer_wait_k(kv);
      pipe.consumer_release_k(kv, lane);
      pass_through_turn(turns);
      pipe.consumer_wait_v(kv);
      pipe.consumer_release_v(kv, lane);
      kv.advance(params.features);
      pass_through_turn(turns);
    }
  }

  // The first block of a loop (the highest, or the lowest: TileMask::kAscending), alone: S,
  // mask, softmax, P into p. A narrow one
  // (TileMask::kNarrowsFirstBlock) at half the width: half the Q K^T, mask and exponentials on
  // the path from the tile's first K to its first overlapped turn, where no GEMM of this
  // warpgroup hides them.
  template <int kLive>
  __device__ __forceinline__ void first_block(float (&s)[kSAcc], uint32_t (&p)[kPRegs], int n, bool narrow,
                                              RowCorrection& correction, const KVRing& kv,
                                              const WarpgroupTurns& turns, const KVPipeline<Storage>& pipe,
                                              PendingStore& pending) {
    n = block_at(n, kv, pipe);
    wait_q();
#ifdef FUSEDATTN_SM90_TRACE
    pipe.consumer_wait_k(kv);  // the trace build's own wait, for the stamp (qk_alone's then passes at once)
    stamp(TraceEvent::kFirstKReady);
#endif
    if constexpr (Mask::kNarrowsFirstBlock) {
      if (narrow) {
        constexpr int kNarrow = Mask::kNarrowKeys;
        float(&s_narrow)[kNarrow / 2] = first_columns<kNarrow / 2>(s);
        qk_alone<kNarrow>(s_narrow, kv, turns, pipe, pending);
        stamp(TraceEvent::kFirstSReady);
        softmax_step<kLive>(s_narrow, n, correction);
        convert_p<kLive>(s_narrow, p);
        return;
      }
    }
    qk_alone(s, kv, turns, pipe, pending);
    stamp(TraceEvent::kFirstSReady);
    softmax_step<kLive>(s, n, correction);
    convert_p<kLive>(s, p);
  }

  // A tile-boundary stamp of this warpgroup (trace.cuh; nothing unless compiled in); tile and
  // blocks where the caller knows them.
  __device__ __forceinline__ void stamp(TraceEvent event, int tile = -1, int blocks = 0) const {
    FUSEDATTN_SM90_WARPGROUP_STAMP(params, event, warpgroup, warp, lane, tile, blocks);
  }

  // The overlapped loop over `blocks` (count + 1 GEMM turns) in the tile's block order
  // (TileMask::first_block, next_block); narrow: the first block is narrow for this slice. kLive:
  // each thread's rows in use (OnlineSoftmax; 1 only under kOneRowCopy).
  template <int kLive = OnlineSoftmax::kRows>
  __device__ __forceinline__ void overlapped_blocks(const KVBlockRange& blocks, bool narrow, KVRing& kv,
                                                    const WarpgroupTurns& turns, const KVPipeline<Storage>& pipe,
                                                    PendingStore& pending) {
    float s[kSAcc];
    uint32_t p[kPBuffers][kPRegs];
    RowCorrection correction;
    if constexpr (kLive < OnlineSoftmax::kRows) zeroed_second_rows(p);
    int n = Mask::first_block(blocks);
    stamp(TraceEvent::kLoopEntered);
    first_block<kLive>(s, p[0], n, narrow, correction, kv, turns, pipe, pending);
    stamp(TraceEvent::kFirstPReady);
    // The sequence's last block comes first (full masks and 128-key tiles go highest first).
    clear_unused_v_rows(n, kv, pipe);
    // Each kv_step takes the block after n, while there is one.
    const auto more = [&] { return Mask::block_in_loop(blocks, Mask::next_block(n)); };
    if constexpr (kDoubleP) {
      // Unrolled by two, so the buffers swap roles without register moves.
      for (; more(); n = Mask::next_block(n)) {
        kv_step<kLive>(s, p[0], p[1], correction, Mask::next_block(n), kv, turns, pipe);
        n = Mask::next_block(n);
        if (Mask::is_last_block(blocks, n)) {
          last_qk_done();
          apply_correction<kLive>(o, correction);
          pv_alone(p[1], kv, turns, pipe);
          return;
        }
        kv_step<kLive>(s, p[1], p[0], correction, Mask::next_block(n), kv, turns, pipe);
      }
    } else {
      for (; more(); n = Mask::next_block(n))
        kv_step<kLive>(s, p[0], p[0], correction, Mask::next_block(n), kv, turns, pipe);
    }
    last_qk_done();
    apply_correction<kLive>(o, correction);
    pv_alone(p[0], kv, turns, pipe);
  }

  // The KV loop of a one-row slice with each block's keys split over the four warps (kWarpSplitCopy;
  // warp_split.cuh): per block, this warp's quarter of S by warp-level MMAs, its K given back, the
  // sequence end's mask if the block is cut, the online softmax of its keys, O += P V of its keys,
  // its V given back. No wgmma: the warpgroup only passes its GEMM turns (count + 1, as the
  // overlapped schedule takes, which the other warpgroup counts on), one before each block. After
  // the last block the warps' partial rows merge into warp 0's o and softmax, and only then does
  // the slice give up its Q slot (last_qk_done), whose rows past those in use the merge writes.
  __device__ __forceinline__ void warp_split_blocks(const KVBlockRange& blocks, KVRing& kv, const WarpgroupTurns& turns,
                                                    const KVPipeline<Storage>& pipe, PendingStore& pending) {
    wait_q();
    const uint32_t q_slot = ptx::smem_addr(q_tile());
    uint32_t q[Split::kQRegs];
    Split::load_q(q, q_slot, q_first_row(), lane);
    release_pending(pending, kv);
    RowCorrection correction;
    for (int n = Mask::first_block(blocks); Mask::block_in_loop(blocks, n); n = Mask::next_block(n)) {
      pass_through_turn(turns);
      // This warp's first key of the block, re-read per block (see WarpSplit::lane_here).
      const int key0 = static_cast<int>(ptx::value_here(static_cast<uint32_t>(warp))) * Split::kKeys;
      float s[Split::kSAcc];
      pipe.consumer_wait_k(kv);
      Split::scores(s, q, ptx::smem_addr(smem.k[kv.k().stage()]), key0, lane);
      pipe.consumer_release_k(kv, lane);
      if (cuts(n)) {
        // Full masks only (kOneRowCopy): the sequence end, the same for every row.
        const MaskedSlice& facts = slice();
        const Mask mask{params.p, params.packing, facts.len_q, facts.len_k};
        const int lane_now = static_cast<int>(Split::lane_here(lane));
        const int hi = mask.right_bound_of_row(int64_t{facts.first_row} + lane_now / 4);
        Mask::apply_right(s, n, {hi, hi}, key0 + 2 * (lane_now % 4));
      }
      softmax.update<1>(s, params.p.scale_log2, params.features.rescale_slack, correction);
      apply_correction<1>(o, correction);
      uint32_t p[Split::kPRegs];
      Split::convert_p(s, p);
      clear_unused_v_rows(n, kv, pipe);
      pipe.consumer_wait_v(kv);
      Split::accumulate_pv(o, p, ptx::smem_addr(smem.v[kv.v().stage()]), key0, lane);
      pipe.consumer_release_v(kv, lane);
      kv.advance(params.features);
    }
    pass_through_turn(turns);
    Split::merge_warps(o, softmax, q_slot, q_first_row(), warp, lane, barrier_id(NamedBarrier::kEpilogue, warpgroup));
    // The merge's generic writes to the Q slot before a later TMA load into it (with o_in_kv, once
    // last_qk_done gives it back).
    ptx::fence_proxy_async_shared();
    last_qk_done();
  }
};

}  // namespace fusedattn::cuda::sm90
