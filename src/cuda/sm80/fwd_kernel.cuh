// The FlashAttention-2 forward kernel on sm80 instructions (runs on sm80..sm90).
//
// One thread block computes O and LSE for kBlockM query rows of one (batch, head); its warps split
// the rows (split-Q), so each warp's online softmax is private and no warp waits on another except
// at the tile-load barriers. Per KV block n (visited from the last to the first):
//   K[n] ready -> start V[n] -> S = Q K[n]^T -> mask (cut blocks only) -> online softmax
//   V[n] ready -> start K[n-1] -> O += P V[n]
// so the load of V overlaps Q K^T and the softmax, and the load of the next K overlaps P V. Where
// the tile has key slices, S = Q K^T and the softmax run slice by slice (each slice's P packed to
// 16 bits before the next slice's scores exist) and O += P V consumes the slices in order, each
// after O's rescale for that slice's max. Under a column mask (MaskKind::kColumn) the walk goes
// from one seen block to the next, past the blocks the mask hides from every row of the CTA.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/column_mask.cuh"
#include "cuda/common/kinds.h"
#include "cuda/common/mask.cuh"
#include "cuda/common/schedule.h"
#include "cuda/common/softmax.cuh"
#include "cuda/common/tail_split.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/sm80/fwd_epilogue.cuh"
#include "cuda/sm80/fwd_kv_split.h"
#include "cuda/sm80/fwd_tile_io.cuh"
#include "cuda/sm80/fwd_warp_mma.cuh"
#include "cuda/sm80/tile_config.h"
#include "fusedattn/attention.h"  // kCudaPageRows
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// How far (log2 units) a row's block max may exceed its reference max before O is rescaled
// (OnlineSoftmax::update): probabilities stay below 2^8, far from any overflow.
constexpr float kRescaleSlack = 8.f;

// A column mask comes on top of a window (or of none: window_left = window_right = -1).
template <MaskKind kMask>
using MaskPolicy = std::conditional_t<kMask == MaskKind::kFull, MaskFull, MaskWindow>;

// Grid: x = query block, y = query head, z = batch, issued x-fastest. Without a mask the CTA
// takes exactly that block, so the blocks running together share one (batch, KV head): its K and
// V are read from HBM once and then hit in L2. With a mask the linear block number goes through
// the grouped longest-first order of cuda/common/schedule.h (bottom query blocks see the most keys
// and start first, over a group of heads that share L2), which shortens the tail of a causal launch.
struct FwdCta {
  int m_block, head, batch;
};

template <MaskKind kMask>
__device__ __forceinline__ FwdCta fwd_cta(int schedule_shift, uint3 block) {
  constexpr bool kMasked = kMask != MaskKind::kFull;
  const GridItem item = grid_item<kMasked>(schedule_shift, block);
  return {kMasked ? static_cast<int>(gridDim.x) - 1 - item.rank : item.rank, item.y, item.z};
}

// Where the query rows of the CTA with block index `block` lie. A split launch (fwd_kv_split.h,
// full masks only) has `parts` CTAs per query block along x, one per part of its key blocks.
struct FwdRows {
  int batch, head;
  SeqInfo seq;
  int64_t m0;  // the block's first row within its sequence; the CTA has no work if m0 >= seq.len_q
  int part;    // which part of the key blocks (0 unless split)

  template <MaskKind kMask, int kBlockM>
  static __device__ __forceinline__ FwdRows of(const FwdParams& p, int schedule_shift, uint3 block, int parts) {
    const int part = static_cast<int>(block.x) % parts;
    block.x /= parts;
    const FwdCta cta = fwd_cta<kMask>(schedule_shift, block);
    const SeqInfo seq = seq_info(p, cta.batch);
    const int64_t m0 = static_cast<int64_t>(cta.m_block) * kBlockM;
    return {cta.batch, cta.head, seq, m0, part};
  }
};

// Part `part` of `parts` of the key blocks kv (near-equal ranges, fwd_kv_split.h).
__device__ __forceinline__ BlockRange part_of(BlockRange kv, int part, int parts) {
  if (parts == 1 || kv.hi <= kv.lo) return kv;
  const int blocks = kv.hi - kv.lo;
  return {kv.lo + part_begin(blocks, parts, part), kv.lo + part_begin(blocks, parts, part + 1)};
}

template <typename Element, int kHeadDim, MaskKind kMask>
__global__ void __launch_bounds__(FwdConfig<kHeadDim>::kThreads, FwdConfig<kHeadDim>::kMinBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdParams p, int schedule_shift, TileSteps k_steps, TileSteps v_steps,
               const __grid_constant__ KvSplit split, ColumnSummary columns) {
  using Cfg = FwdConfig<kHeadDim>;
  constexpr int kSlices = Cfg::kSlices;
  using QTile = TileIo<Element, Cfg::kBlockM, kHeadDim, Cfg::kPitch, Cfg::kThreads>;
  using KVTile = TileIo<Element, Cfg::kBlockN, kHeadDim, Cfg::kPitch, Cfg::kThreads>;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;

  extern __shared__ __align__(128) unsigned char smem[];
  Element* smem_q = reinterpret_cast<Element*>(smem);  // reused for O in the epilogue
  const uint32_t smem_q_addr = ptx::smem_addr(smem);
  const uint32_t smem_k_addr = smem_q_addr + Cfg::kSmemQ;
  const uint32_t smem_v_addr = smem_k_addr + Cfg::kSmemKV;

  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int warp_row0 = warp * Cfg::kWarpRows;
  const FwdRows rows = FwdRows::of<kMask, kBlockM>(p, schedule_shift, blockIdx, split.parts);
  const int batch = rows.batch, head = rows.head;
  const SeqInfo seq = rows.seq;
  const int64_t m0 = rows.m0;
  if (m0 >= seq.len_q) return;  // varlen: this sequence is shorter than the longest one
  const int rows_q = rows_inside<kBlockM>(seq.len_q - m0);
  // A warp whose rows all lie past the tile's last query row (a short sequence's last tile, a
  // decode tile of a few rows) computes nothing: it only loads its share of the tiles and meets
  // the others at the barriers; its O, LSE and rows are never stored.
  const bool idle = warp_row0 >= rows_q;
  const int kv_head = head / (p.heads_q / p.heads_kv);  // GQA/MQA: heads of a group share K, V

  const Element* q = static_cast<const Element*>(p.q) + batch * p.q_stride.batch + q_row_offset(p, seq.q_start, m0) +
                     head * p.q_stride.head;
  // Paged K/V (FwdParams::block_table): the sources start at page 0's first row, and block n's
  // page comes from the table (a page holds a whole number of blocks: kCudaPageRows).
  static_assert(kCudaPageRows % kBlockN == 0, "a KV block must never straddle two pages");
  const bool paged = p.block_table != nullptr;
  const int64_t k_seq0 = paged ? 0 : batch * p.k_stride.batch + seq.k_start * p.k_stride.row;
  const int64_t v_seq0 = paged ? 0 : batch * p.v_stride.batch + seq.k_start * p.v_stride.row;
  const Element* k = static_cast<const Element*>(p.k) + k_seq0 + kv_head * p.k_stride.head;
  const Element* v = static_cast<const Element*>(p.v) + v_seq0 + kv_head * p.v_stride.head;
  const int len_k = static_cast<int>(seq.len_k);  // < kMaxMaskedSeqlen (checked by the launcher)
  // K and V of KV block n. Only the sequence's last block may end past it (rows there are
  // zero-filled); it is the first one visited (kv.hi is at most ceil(len_k / kBlockN)), so every
  // later block takes the lean whole-tile copies.
  using KVSource = typename KVTile::TileSource;
  const KVSource k_src(k, p.k_stride.row, k_steps, p.head_dim, tid), v_src(v, p.v_stride.row, v_steps, p.head_dim, tid);
  // This thread's chunk in the first row of block n (page_stride: k's or v's, in elements).
  // Once per CTA, in 32 bits (validation keeps CUDA pages below 2^31 rows).
  const int blocks_per_page = paged ? static_cast<int>(p.page_size) / kBlockN : 1;
  auto block_src = [&](const KVSource& src, int64_t page_stride, int n) {
    if (!paged) return src.first_row(n);
    return src.paged_first_row(table_page(p, batch, n / blocks_per_page), page_stride * KVTile::kElemBytes,
                               n % blocks_per_page);
  };
  auto load_kv = [&](uint32_t smem_tile, const KVSource& src, int64_t page_stride, int n) {
    src.load_async(smem_tile, block_src(src, page_stride, n), rows_inside<kBlockN>(len_k - n * kBlockN), tid);
    ptx::cp_async_commit();
  };
  auto load_whole_kv = [&](uint32_t smem_tile, const KVSource& src, int64_t page_stride, int n) {
    src.load_whole_async(smem_tile, block_src(src, page_stride, n), tid);
    ptx::cp_async_commit();
  };

  const MaskPolicy<kMask> mask(p, seq.len_q, seq.len_k);
  const int64_t i_first = m0, i_last = m0 + rows_q - 1;
  const BlockRange kv = part_of(mask.kv_blocks(i_first, i_last, kBlockN), rows.part, split.parts);
  const BlockRange uncut = mask.uncut_blocks(i_first, i_last, kBlockN);
  // The key blocks to visit, from the last down: every block of kv, or under a column mask those
  // some row of the CTA sees (warp-uniform, so the warps walk the same blocks without a barrier).
  constexpr bool kColumns = kMask == MaskKind::kColumn;
  const ColumnMaskView columns_here = kColumns ? ColumnMaskView::of(p, columns, batch, head) : ColumnMaskView{};
  auto visit_from = [&](int n) -> ColumnVisit {
    if constexpr (kColumns)
      return columns_here.next_seen(n, kv.lo, static_cast<int>(i_first), static_cast<int>(i_last) + 1);
    else
      return {n, false};
  };
  const ColumnVisit first_visit = visit_from(kv.hi - 1);

  float o[Cfg::kMTiles][Cfg::kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < Cfg::kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < Cfg::kDTiles; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[mt][dt][i] = 0.f;
  OnlineSoftmax<Cfg::kMTiles> softmax;
  softmax.init();
  // A negative scale is folded into Q (below) so the softmax may track the max of raw scores.
  const float scale_log2 = fabsf(p.scale_log2);

  if (first_visit.n >= kv.lo) {
    QTile::load_async(smem_q_addr, q, p.q_stride.row, rows_q, p.head_dim, tid);
    load_kv(smem_k_addr, k_src, p.k_stride.batch, first_visit.n);
    if (p.scale_log2 < 0.f) {
      ptx::cp_async_wait<0>();
      QTile::negate_own_chunks(smem, tid);
    }
    const FwdLaneAddresses<Element, Cfg::kPitch> lanes(smem_q_addr, lane, warp_row0);
    // This thread's first S row (fragment row g) and the keys it may see, unclamped.
    const ThreadWindow window = thread_window(mask, m0 + warp_row0 + lane / 4);
    const int col_in_tile = 2 * (lane % 4);

    constexpr uint32_t kSliceBytes = Cfg::kSliceN * Cfg::kPitch * sizeof(Element);
    // P of the block whose scores were computed last and its rows' rescale factors, handed from
    // the score half of a block to its P V half.
    uint32_t p_frag[kSlices][Cfg::kMTiles][Cfg::kSliceNTiles / 2][4];
    RowCorrection<Cfg::kMTiles> correction[kSlices];
    // kFirst: the first block visited, the only one that may end past the sequence (the last
    // block, unless a column mask hides it).
    // column_cut: a column mask cuts block n.
    auto scores = [&](auto first, int n, bool column_cut) {
      constexpr bool kFirst = decltype(first)::value;
      ptx::cp_async_wait<0>();
      __syncthreads();  // K[n] visible to all warps; every warp is done with the previous V
      if constexpr (kFirst)
        load_kv(smem_v_addr, v_src, p.v_stride.batch, n);
      else
        load_whole_kv(smem_v_addr, v_src, p.v_stride.batch, n);

      if (idle) return;
      const bool cut_left = cuts_left(mask, uncut, n), cut = cut_left || n >= uncut.hi;
#pragma unroll
      for (int j = 0; j < kSlices; ++j) {
        float s[Cfg::kMTiles][Cfg::kSliceNTiles][4];
        gemm_qk<Element, kHeadDim, Cfg::kQkUnroll>(s, lanes, Cfg::kSmemQ + j * kSliceBytes);
        if (cut) mask_cut_block<MaskPolicy<kMask>, kFirst>(s, window, n * kBlockN + j * Cfg::kSliceN + col_in_tile, cut_left);
        if constexpr (kColumns)
          if (column_cut)
            hide_column_scores<Cfg::kColumnCall>(s, p, columns_here, n, n * kBlockN,
                                                 static_cast<int>(m0) + warp_row0 + lane / 4,
                                                 j * Cfg::kSliceN + col_in_tile, len_k);
        if (kFirst && j == 0)
          softmax.template update<true>(s, scale_log2, kRescaleSlack, correction[j]);
        else
          softmax.template update<false>(s, scale_log2, kRescaleSlack, correction[j]);
        pack_p<Element>(p_frag[j], s);
        // O of the earlier blocks needs the first slice's factors before any P V; doing it now
        // frees their registers before the barrier and the tile load.
        if (j == 0 && !kFirst) softmax.template rescale_o<Cfg::kSkipUnitRescale>(o, correction[0]);
      }
    };
    // load_next: whether a block is visited after n, whose K is loaded now: n - 1, or under a
    // column mask `next` (n - 1 spelled so, the full and window kernels' registers stay as they
    // were; passing it as `next` moved them by up to 13).
    auto accumulate = [&](bool load_next, int n, int next) {
      ptx::cp_async_wait<0>();
      __syncthreads();  // V[n] visible to all warps; every warp is done with K[n]
      if (load_next) load_whole_kv(smem_k_addr, k_src, p.k_stride.batch, kColumns ? next : n - 1);
      if (idle) return;
#pragma unroll
      for (int j = 0; j < kSlices; ++j) {
        if (j > 0) softmax.template rescale_o<Cfg::kSkipUnitRescale>(o, correction[j]);
        gemm_pv<Element>(o, p_frag[j], lanes, Cfg::kSmemQ + Cfg::kSmemKV + j * kSliceBytes);
      }
    };
    if constexpr (kColumns) {
      // The seen blocks only: one block's P V, then the next one's scores. The block after next
      // is found between the two, where P is spent and S not yet computed (found before the P V,
      // beside P's registers, d32 spilled 4 B).
      ColumnVisit visit = first_visit, next = visit_from(first_visit.n - 1);
      scores(std::true_type{}, visit.n, visit.cut);
      for (;;) {
        accumulate(next.n >= kv.lo, visit.n, next.n);
        if (next.n < kv.lo) break;
        visit = next;
        next = visit_from(visit.n - 1);
        scores(std::false_type{}, visit.n, visit.cut);
      }
    } else if constexpr (Cfg::kPvFirst) {
      scores(std::true_type{}, kv.hi - 1, false);
      // The loop runs from one block's P V to the next block's scores, so every block's P V is the
      // loop's one copy of it: the first block's, peeled, started from zero accumulators, and
      // ptxas, seeing O's registers free, loaded V fragments ahead of the softmax and spilled
      // (d128); a copy for the last block after the loop cost the d256 window row a spill. (The
      // column walk's form of this loop, on this one's blocks, spilled d128 again.)
      for (int n = kv.hi - 1;; --n) {
        accumulate(n > kv.lo, n, n - 1);
        if (n == kv.lo) break;
        scores(std::false_type{}, n - 1, false);
      }
    } else {
      // A block's scores and its P V in one iteration: the last slice's softmax and the first
      // slices' P V lie in one basic-block chain, where the scheduler overlaps them.
      scores(std::true_type{}, kv.hi - 1, false);
      accumulate(kv.hi - 1 > kv.lo, kv.hi - 1, kv.hi - 2);
      for (int n = kv.hi - 2; n >= kv.lo; --n) {
        scores(std::false_type{}, n, false);
        accumulate(n > kv.lo, n, n - 1);
      }
    }
  }

  float inv_sum[Cfg::kMTiles][2], lse[Cfg::kMTiles][2];
  softmax.finalize(inv_sum, lse);
  // The epilogue's coordinates come from the block and thread index read again (ptx/sync.cuh) rather
  // than from the prologue's values held across the mainloop, where d128 has no registers to spare.
  const FwdRows out_rows = FwdRows::of<kMask, kBlockM>(p, schedule_shift, ptx::block_index_here(), split.parts);
  const int out_tid = ptx::thread_index_here(), out_lane = out_tid % kWarpSize;
  const int out_warp_row0 = out_tid / kWarpSize * Cfg::kWarpRows;
  const int out_rows_q = rows_inside<kBlockM>(out_rows.seq.len_q - out_rows.m0);
  if (split.parts > 1) {
    // A part's rows go to the workspace in fp32; the combine kernel writes O and LSE.
    const bool varlen = p.cu_seqlens_q != nullptr;
    const int64_t row0 =
        (varlen ? out_rows.seq.q_start * p.view_group : out_rows.batch * p.seqlen_q) + out_rows.m0;
    store_part(split, split.slot(out_rows.part, out_rows.head, row0), o, inv_sum, lse, out_warp_row0, out_rows_q,
               out_lane);
    return;
  }
  // Each warp overwrites only its own Q rows, but the coalesced store below reads every warp's
  // rows, so both sides of the staging need a block barrier.
  __syncthreads();
  stage_o<Element, Cfg::kPitch>(smem_q, o, inv_sum, out_warp_row0, out_lane);
  __syncthreads();
  Element* out = static_cast<Element*>(p.o) + out_rows.batch * p.o_stride.batch +
                 o_row_offset(p, out_rows.seq.q_start, out_rows.m0) + out_rows.head * p.o_stride.head;
  QTile::store(out, p.o_stride.row, smem, out_rows_q, p.head_dim, out_tid);
  if (p.lse != nullptr)
    store_lse(p.lse + out_rows.batch * p.lse_batch_stride + out_rows.head * p.lse_head_stride +
                  lse_row_offset(p, out_rows.seq.q_start, out_rows.m0),
              p.lse_row_stride, lse, out_warp_row0, out_rows_q, out_lane);
}

}  // namespace fusedattn::cuda::sm80
