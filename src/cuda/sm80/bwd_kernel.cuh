// The sm80 FlashAttention-2 backward main kernel (mma.sync + ldmatrix + cp.async).
//
// One CTA owns KV block n of (sequence b, KV head kvh) and keeps its dK and dV in registers while
// it walks over every (query head of the GQA group, query block that sees block n); so dK/dV of a
// group are summed without atomics and K/V are never expanded. Warp w owns key rows
// [kWarpKeys r, kWarpKeys (r + 1)), r = w % kKeyWarps, and works on transposed scores:
//
//   S^T  = K Q^T                      (warp: its keys x kBlockM queries)
//   P^T  = exp2(S^T * scale_log2 - lse2[query])      lse2 = +inf for rows without keys => P = 0
//   dP^T = V dO^T
//   dS^T = P^T o (dP^T - delta[query])
//   dV  += P^T dO       dK += dS^T Q  (A operand straight from the C fragments above)
//   dQ  += dS K         (dS^T goes through shared memory to a warp grid over [kBlockM x D]; the
//                        fp32 result is staged in shared memory and added to the workspace in
//                        contiguous row segments: atomics -- per warp, 16-byte vector reductions
//                        on sm_90, where the tile table says so -- or ordered adds when
//                        deterministic)
//
// A warp computes its S^T columns in T::kQuerySlices slices, each consumed (dV, dK, dS^T
// hand-off) before the next, so fewer score registers are live at once.
//
// With kv_registers (T::kKvRegisters) a warp reads its K and V rows from shared memory once per
// CTA, as the A fragments of S^T and dP^T, and keeps them in registers for the whole query loop;
// dQ = dS K still reads K from shared memory (a warp's dQ tile spans all the block's keys).
//
// With column warps (kColWarps > 1, head dims above 96) the kColWarps warps sharing key rows
// each compute S^T and dP^T for 1/kColWarps of the queries, hand P^T and dS^T over in shared
// memory, and accumulate dV and dK for 1/kColWarps of the columns from there.
//
// dK is scaled by the softmax scale once at the end; dQ is scaled by the convert kernel.
//
// Full-mask launches may split their last wave (bwd_split.h): a part walks a contiguous share of
// its item's (query head, query block) iterations and hands its dK/dV to the last part to finish
// through the workspace (bwd_split.cuh).
#pragma once

#include <cstdint>

#include "cuda/common/column_mask.cuh"
#include "cuda/common/int_math.h"
#include "cuda/common/kinds.h"
#include "cuda/common/schedule.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mufu.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/sm80/bwd_column_spans.cuh"
#include "cuda/sm80/bwd_mask.h"
#include "cuda/sm80/bwd_shared.cuh"
#include "cuda/sm80/bwd_split.cuh"
#include "cuda/sm80/bwd_split.h"
#include "cuda/sm80/bwd_tile_io.cuh"
#include "cuda/sm80/bwd_warp_mma.cuh"

namespace fusedattn::cuda::sm80 {

// Full masks on a row that splits (kSplit, bwd_split.h): a one-dimensional grid, CTA i takes item
// i (KV block fastest, then KV head, then batch) or, past the plan's whole items, a part of a
// split item. Otherwise the grid is x = KV block, y = KV head, z = batch: without a window the
// CTA takes exactly that block; with one its linear block number goes through the grouped order
// of cuda/common/schedule.h: KV block 0 (under a causal mask the one most queries see) of every
// (batch, KV head) of a group first, over a group whose Q/dO/dQ share the L2, which shortens the
// tail of a causal launch. Either way the lower KV blocks of a head start first, which the
// deterministic mode's ordered dQ adds rely on.

template <MaskKind kMask, bool kSplit, int kBlockN>
__device__ __forceinline__ BwdCta bwd_cta(const BwdParams& p, const BwdWorkspace& ws, int schedule_shift) {
  if constexpr (kSplit) {
    const BwdSplitCta at = bwd_split_cta(static_cast<int>(blockIdx.x), ws.split_whole, ws.split_parts);
    const int kv_blocks = static_cast<int>(ceil_div(p.seqlen_k, kBlockN));
    const int pair = at.item / kv_blocks;
    return {at.item - pair * kv_blocks, pair % p.heads_kv, pair / p.heads_kv, at.item, at.part, at.parts};
  } else {
    const GridItem item = grid_item<kMask != MaskKind::kFull>(schedule_shift);
    return {item.rank, item.y, item.z, 0, 0, 1};
  }
}

// True while compiling sm_80..sm_89 SASS (ptxas allocates registers differently there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
constexpr bool kSm80Sass = true;
#else
constexpr bool kSm80Sass = false;
#endif

template <typename Element, int kHeadDim, MaskKind kMask, bool kLargeSmem>
__device__ __forceinline__ void bwd_main(const BwdParams& p, const BwdWorkspace& ws, int schedule_shift) {
  using T = BwdTile<kHeadDim, kLargeSmem>;
  using Shared = BwdShared<Element, kHeadDim, kLargeSmem>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN, kPitch = T::kPitch;
  constexpr int kWarpQueries = T::kWarpQueries;
  constexpr int kSlices = T::kQuerySlices, kSliceQueries = T::kSliceQueries;
  constexpr int kSliceTiles = kSliceQueries / kMmaCols;  // n8 tiles of one slice
  constexpr int kOutTiles = T::kWarpOutDim / kMmaCols;
  constexpr int kKeyTiles = T::kKeyTiles;
  constexpr int kDimSteps = kHeadDim / kMmaK;  // k16 steps of S^T = K Q^T and dP^T = V dO^T
  // Q/dO reads take the swizzle XOR on their full stage address (bwd_warp_mma.cuh): only where
  // the stage alternates, so the address is no loop invariant.
  constexpr bool kStagedXor = T::kXorStageAddress;
  extern __shared__ __align__(kBwdTileAlignBytes) unsigned char smem_raw[];  // see BwdShared
  Shared& smem = *reinterpret_cast<Shared*>(smem_raw);

  BwdCoords cta;
  constexpr bool kSplit = kMask == MaskKind::kFull && bwd_row_splits(kHeadDim, kLargeSmem);
  const BwdCta here = bwd_cta<kMask, kSplit, kBlockN>(p, ws, schedule_shift);
  // Split rows keep the decoded CTA in shared memory for after the main loop: decoding it again
  // there made the compiler keep the plan's kernel parameters in registers across the loop, and
  // ptxas spill at the 255-register limit. Every thread writes the same values and reads back its
  // own write, so no barrier is needed.
  if constexpr (kSplit) smem.kept_cta = here;
  cta.n = here.n;
  cta.kvh = here.kvh;
  cta.b = here.b;
  cta.group = p.heads_q / p.heads_kv;
  cta.seq = seq_info(p, cta.b);
  const int64_t key0 = cta.n * kBlockN;
  if (key0 >= cta.seq.len_k) return;  // varlen grids cover max_seqlen_k
  cta.m_blocks = query_blocks_of_kv_block(p, cta.n, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);
  // A column mask on top of the window (or of none): the query blocks that rows hidden from every
  // key of this block leave out, at the ends of the sequence (documents: the rows after the
  // block's document). In deterministic mode only where every KV block's span of query blocks
  // grows with the block (bwd_column_spans.cuh: the semaphores then start at the first adding
  // block's turn); elsewhere every KV block of the window adds into each of its query blocks there,
  // the hidden ones masked whole.
  //
  // Under a column mask each head's query blocks are visited from the last down. Deterministic
  // mode then waits less: the blocks adding into a query block go in turn, and going down, a KV
  // block's first add (into its highest query block) waits for its predecessor's first add, not
  // for its third (going up from the diagonal); and a KV block that straddles two documents adds
  // into the later one, where it is the first to add, before it waits in the earlier one, so the
  // documents' turns do not wait for one another.
  constexpr bool kColumns = kMask == MaskKind::kColumn;
  using Cursor = QueryCursor<kColumns>;
  if constexpr (kColumns) {
    const ColumnSpans<kBlockM> spans{p, ws.columns, cta.b, cta.kvh * cta.group, cta.group,
                                     static_cast<int>(cta.seq.len_q)};
    const bool narrows = !p.deterministic || spans.grow();
    if (narrows && !cta.m_blocks.empty()) {
      const BlockRange seen = spans.of(static_cast<int>(cta.n));
      if (seen.begin > cta.m_blocks.begin) cta.m_blocks.begin = seen.begin;
      if (seen.end < cta.m_blocks.end) cta.m_blocks.end = seen.end;
      if (cta.m_blocks.end < cta.m_blocks.begin) cta.m_blocks.end = cta.m_blocks.begin;
    }
  }
  cta.iterations = cta.m_blocks.empty() ? 0 : cta.group * static_cast<int>(cta.m_blocks.end - cta.m_blocks.begin);

  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warp_key0 = warp % T::kKeyWarps * T::kWarpKeys;  // this warp's first key row inside the block
  const int col_warp = warp / T::kKeyWarps;
  const int warp_q0 = col_warp * kWarpQueries;  // this warp's first S^T column inside the query block

  const uint32_t smem_k = ptx::smem_addr(smem.k), smem_v = ptx::smem_addr(smem.v);
  const uint32_t smem_ds = ptx::smem_addr(smem.ds), smem_pt = ptx::smem_addr(smem.pt);
  const LdsmLane lane_tile = ldsm_lane<kPitch, Element>();  // Q, K, V, dO tiles
  const LdsmLane lane_ds = ldsm_lane<T::kDsPitch, Element>();
  const int warp_col0 = col_warp * T::kWarpOutDim;  // first dK/dV column of this warp
  const int out_pair0 = warp_col0 / (2 * kMmaCols);

  // Where a query block's Q and dO rows and its workspace rows (lse2, delta) start. The prefetch
  // keeps one for the next block and steps it by a block within a head: a 64-bit add per operand
  // instead of rebuilding (batch, row, head) offsets with 64-bit multiplies every iteration.
  struct QuerySource {
    const Element* q;
    const Element* dout;
    int64_t ws_row;
  };
  auto source_of = [&](const Cursor& at) {
    const int64_t row0 = static_cast<int64_t>(at.m) * kBlockM;
    return QuerySource{
        operand_base<Element>(p.q, p.q_stride, cta.b, cta.seq.q_start, at.h) + row0 * p.q_stride.row,
        operand_base<Element>(p.dout, p.do_stride, cta.b, cta.seq.q_start, at.h) + row0 * p.do_stride.row,
        ws.row_base(p, cta.b, at.h) + row0};
  };

  // Issues the cp.async copies of the Q, dO, lse2 and delta of query block `at` (rows from `src`)
  // into buffer `stage`.
  auto load_query_block = [&](const Cursor& at, const QuerySource& src, int stage) {
    const int64_t rows_left = cta.seq.len_q - static_cast<int64_t>(at.m) * kBlockM;
    load_tile_async<kBlockM, kHeadDim, kPitch, T::kThreads>(ptx::smem_addr(smem.stage[stage].q), src.q,
                                                            p.q_stride.row, 0, rows_left, p.head_dim);
    load_tile_async<kBlockM, kHeadDim, kPitch, T::kThreads>(ptx::smem_addr(smem.stage[stage].dout), src.dout,
                                                            p.do_stride.row, 0, rows_left, p.head_dim);
    load_floats_async<kBlockM, T::kThreads>(smem.lse2[stage], ws.lse2 + src.ws_row, threadIdx.x);
    // Under a column mask the quads' per-thread source offset is derived from the thread index
    // read again here: held across the loop it was the one value the d64 large-memory column
    // instance spilled (4 bytes, reloaded every iteration) once its query blocks went downwards.
    // The full and window instances keep theirs (the re-read reorders their SASS: causal d64
    // lost 0.7%).
    if constexpr (T::kDeltaInDp)
      load_float_quads_async<kBlockM, T::kThreads>(smem.delta[stage], ws.delta + src.ws_row,
                                                   kColumns ? ptx::thread_index_here() : threadIdx.x);
    else
      load_floats_async<kBlockM, T::kThreads>(smem.delta[stage], ws.delta + src.ws_row, threadIdx.x);
  };

  float acc_dk[kKeyTiles][kOutTiles][4] = {}, acc_dv[kKeyTiles][kOutTiles][4] = {};

  if (cta.iterations > 0) {
    load_tile_async<kBlockN, kHeadDim, kPitch, T::kThreads>(
        smem_k, operand_base<Element>(p.k, p.k_stride, cta.b, cta.seq.k_start, cta.kvh), p.k_stride.row, key0,
        cta.seq.len_k, p.head_dim);
    load_tile_async<kBlockN, kHeadDim, kPitch, T::kThreads>(
        smem_v, operand_base<Element>(p.v, p.v_stride, cta.b, cta.seq.k_start, cta.kvh), p.v_stride.row, key0,
        cta.seq.len_k, p.head_dim);
  }
  Cursor cur{cta.kvh * cta.group, Cursor::first_block(cta), static_cast<int>(cta.m_blocks.end - cta.m_blocks.begin)};
  if (here.parts > 1) {
    // This part's share of the item's iterations (a split item has at least kTailMinPartSteps per
    // part, so cur.left > 0).
    const BwdPartStart start = bwd_part_start(cta.iterations, cur.left, here.part, here.parts);
    cta.iterations = start.iterations;
    cur.h += start.head;
    cur.m += start.block;
    cur.left -= start.block;
  }
  Cursor next = cur;
  QuerySource next_src = source_of(cur);
  if (cta.iterations > 0) {
    load_query_block(cur, next_src, 0);
    ptx::cp_async_commit();
  }

  // This warp's K and V rows as A fragments, with kv_registers (a single unused tile otherwise,
  // never read).
  constexpr int kKvFragmentTiles = T::kKvRegisters ? kKeyTiles : 1;
  uint32_t k_frag[kKvFragmentTiles][kDimSteps][4], v_frag[kKvFragmentTiles][kDimSteps][4];
  if constexpr (T::kKvRegisters) {
    if (cta.iterations > 0) {
      // K and V came with the first query block: the loop's first wait and barrier find it landed.
      ptx::cp_async_wait<0>();
      __syncthreads();
      load_a_fragments<kKeyTiles, kHeadDim, kPitch, Element>(k_frag, smem_k, lane_tile, warp_key0);
      load_a_fragments<kKeyTiles, kHeadDim, kPitch, Element>(v_frag, smem_v, lane_tile, warp_key0);
    }
  }

  for (int it = 0; it < cta.iterations; ++it) {
    const int stage = T::kStages == 2 ? it % 2 : 0;
    if (T::kStages == 1 && it > 0) {
      __syncthreads();  // every warp is done with the single Q/dO buffer of the last iteration
      load_query_block(next, next_src, 0);  // next == cur here: it advances below
      ptx::cp_async_commit();
    }
    ptx::cp_async_wait<0>();
    // The current buffer has landed for every thread, and every warp has finished the previous
    // iteration: its dQ reads of dS and (two stages) its reads of the buffer refilled below.
    __syncthreads();
    const int64_t ws_row = next_src.ws_row;  // this block's first workspace row (next == cur until here)
    if (next.advance(cta)) {
      next_src = source_of(next);
    } else {
      constexpr int kStep = kColumns ? -kBlockM : kBlockM;  // the cursor's direction
      next_src.q += kStep * p.q_stride.row;
      next_src.dout += kStep * p.do_stride.row;
      next_src.ws_row += kStep;
    }
    if (T::kStages == 2 && it + 1 < cta.iterations) {
      load_query_block(next, next_src, stage ^ 1);
      ptx::cp_async_commit();
    }

    const int64_t m = cur.m;
    const uint32_t smem_q = ptx::smem_addr(smem.stage[stage].q), smem_do = ptx::smem_addr(smem.stage[stage].dout);
    const float* lse2 = smem.lse2[stage];
    const float* delta = smem.delta[stage];

    // The warp's S^T columns, kSliceQueries at a time: each slice's P^T and dS^T are consumed
    // (dV, dK, hand-off) before the next slice's are computed.
    bool needs_mask;
    if constexpr (kMask != MaskKind::kFull && T::kMaskRange) {
      // The blocks a window edge cuts are the two ends of the diagonal band: a range of
      // loop-invariant values and two 32-bit compares, not two key_range evaluations in 64 bits.
      // Written here, not before the loop: ptxas hoists it either way, but computed ahead of the
      // loop by hand it changed the d128 window instance's allocation and spilled 8 bytes.
      const BlockRange unmasked = unmasked_query_blocks(p, true, cta.n, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);
      needs_mask = cur.m < static_cast<int>(unmasked.begin) || cur.m >= static_cast<int>(unmasked.end);
    } else {
      needs_mask =
          block_needs_mask(p, kMask != MaskKind::kFull, m, cta.n, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);
    }
    // A query block the column mask hides whole is masked whole (P = 0): it is visited only where
    // the range above could not leave it out.
    bool column_cut = false;
    if constexpr (kColumns) {
      const int row0 = static_cast<int>(m) * kBlockM;
      const int rows_end = cta.seq.len_q - row0 < kBlockM ? static_cast<int>(cta.seq.len_q) : row0 + kBlockM;
      const ColumnCover cover = ColumnMaskView::of(p, ws.columns, cta.b, cur.h).cover(static_cast<int>(cta.n), row0, rows_end);
      column_cut = cover.cut || !cover.seen;
    }
#pragma unroll
    for (int slice = 0; slice < kSlices; ++slice) {
      const int q0 = warp_q0 + slice * kSliceQueries;  // first S^T column of this slice

      // P^T = exp2(S^T * scale_log2 - lse2), zero outside the mask.
      HiddenProbabilities<kKeyTiles, kSliceTiles> hidden;
      if (kColumns && column_cut)
        hidden.find(p, ColumnMaskView::of(p, ws.columns, cta.b, cur.h), static_cast<int>(cta.n),
                    static_cast<int>(key0), warp_key0 + g,
                    static_cast<int>(m) * kBlockM + q0 + 2 * t, static_cast<int>(cta.seq.len_k));
      float pt[kKeyTiles][kSliceTiles][4];
      warp_gemm_rows_bt<T::kKvRegisters, kKeyTiles, kSliceQueries, kHeadDim, kPitch, Element, false, kStagedXor>(
          pt, k_frag, smem_k, warp_key0, smem_q, lane_tile, q0);
#pragma unroll
      for (int j = 0; j < kSliceTiles; ++j) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + q0 + j * kMmaCols + 2 * t);
#pragma unroll
        for (int mi = 0; mi < kKeyTiles; ++mi)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            pt[mi][j][e] = ptx::ex2_approx(fmaf(pt[mi][j][e], p.scale_log2, -(e % 2 ? l2.y : l2.x)));
      }
      // A separate pass over the few blocks that need it: a mask test inside the loop above put a
      // branch between every two exponentials and serialised them.
      if (needs_mask) {
        const LaneMask mask = lane_mask(p, kMask != MaskKind::kFull, key0 + warp_key0 + g, m * kBlockM + q0 + 2 * t,
                                        cta.seq.len_q, cta.seq.len_k);
#pragma unroll
        for (int mi = 0; mi < kKeyTiles; ++mi)
#pragma unroll
          for (int j = 0; j < kSliceTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (!mask.visible(mi * kMmaRows + e / 2 * 8, j * kMmaCols + e % 2)) pt[mi][j][e] = 0.f;
      }
      if (kColumns && column_cut) hidden.apply(pt);
      // dV += P^T dO (this warp's output columns), or hand P^T to the column warps.
      if constexpr (T::kScoresShared && T::kStmatrix)
        store_c_tile_stsm<T::kDsPitch, Element>(smem.pt, smem_pt, lane_ds, pt, warp_key0, q0);
      else if constexpr (T::kScoresShared)
        store_c_tile<T::kDsPitch>(smem.pt, pt, warp_key0, q0);
      else
        warp_gemm_rab<T::kWarpOutDim, kSliceQueries, kPitch, Element, kStagedXor>(acc_dv[0], pt[0], smem_do, lane_tile,
                                                                                  q0, out_pair0);

      // dS^T = P^T o (dP^T - delta), with dP^T = V dO^T, for the kTiles n8 columns of `ds` from
      // S^T column q0 + 8 * j0 (P^T tiles j0..).
      auto ds_columns = [&](auto& ds, int j0) {
        constexpr int kTiles = sizeof(ds[0]) / sizeof(ds[0][0]);
        const int c0 = q0 + j0 * kMmaCols;
        if constexpr (T::kDeltaInDp) {
          // The accumulators start at -delta (quads in the C-fragment order): one multiply per element.
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            const float4 nd = *reinterpret_cast<const float4*>(delta + 2 * (c0 + j * kMmaCols + 2 * t));
#pragma unroll
            for (int mi = 0; mi < kKeyTiles; ++mi) {
              ds[mi][j][0] = nd.x;
              ds[mi][j][1] = nd.y;
              ds[mi][j][2] = nd.z;
              ds[mi][j][3] = nd.w;
            }
          }
          warp_gemm_rows_bt<T::kKvRegisters, kKeyTiles, kTiles * kMmaCols, kHeadDim, kPitch, Element, true, kStagedXor>(
              ds, v_frag, smem_v, warp_key0, smem_do, lane_tile, c0);
#pragma unroll
          for (int mi = 0; mi < kKeyTiles; ++mi)
#pragma unroll
            for (int j = 0; j < kTiles; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) ds[mi][j][e] *= pt[mi][j0 + j][e];
        } else {
          warp_gemm_rows_bt<T::kKvRegisters, kKeyTiles, kTiles * kMmaCols, kHeadDim, kPitch, Element, false, kStagedXor>(
              ds, v_frag, smem_v, warp_key0, smem_do, lane_tile, c0);
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            const float2 nd = *reinterpret_cast<const float2*>(delta + c0 + j * kMmaCols + 2 * t);
#pragma unroll
            for (int mi = 0; mi < kKeyTiles; ++mi)
#pragma unroll
              for (int e = 0; e < 4; ++e) ds[mi][j][e] = pt[mi][j0 + j][e] * (ds[mi][j][e] + (e % 2 ? nd.y : nd.x));
          }
        }
      };
      // Hands dS^T columns to the dQ warp grid (and the column warps) through shared memory,
      // rounded like the dK operand.
      auto store_ds = [&](const auto& ds, int c0) {
        if constexpr (T::kStmatrix)
          store_c_tile_stsm<T::kDsPitch, Element>(smem.ds, smem_ds, lane_ds, ds, warp_key0, c0);
        else
          store_c_tile<T::kDsPitch>(smem.ds, ds, warp_key0, c0);
      };
      if constexpr (T::kKvRegisters) {
        // V is in registers, so dP^T costs the same ldmatrix and MMAs computed one 16-column pair
        // at a time, and each pair's dS^T leaves for shared memory before the next: at most
        // kKeyTiles x 2 dS^T tiles are live beside P^T, K, V, dK and dV instead of the whole
        // slice's (which made ptxas spill).
        static_assert(T::kScoresShared, "dK reads dS^T back from shared memory");
#pragma unroll
        for (int np = 0; np < kSliceTiles / 2; ++np) {
          float ds_pair[kKeyTiles][2][4];
          ds_columns(ds_pair, 2 * np);
          store_ds(ds_pair, q0 + np * 2 * kMmaCols);
        }
      } else {
        float dst[kKeyTiles][kSliceTiles][4];
        ds_columns(dst, 0);
        // dK += dS^T Q.
        if constexpr (!T::kScoresShared)
          warp_gemm_rab<T::kWarpOutDim, kSliceQueries, kPitch, Element, kStagedXor>(acc_dk[0], dst[0], smem_q, lane_tile,
                                                                                    q0, out_pair0);
        store_ds(dst, q0);
      }
    }
    __syncthreads();

    if constexpr (T::kScoresShared) {
      // dV += P^T dO and dK += dS^T Q over the whole query block, for this warp's columns.
      warp_gemm_sab<kKeyTiles, T::kWarpOutDim, kBlockM, T::kDsPitch, kPitch, Element, kStagedXor>(
          acc_dv, smem_pt, lane_ds, warp_key0, smem_do, lane_tile, out_pair0);
      warp_gemm_sab<kKeyTiles, T::kWarpOutDim, kBlockM, T::kDsPitch, kPitch, Element, kStagedXor>(
          acc_dk, smem_ds, lane_ds, warp_key0, smem_q, lane_tile, out_pair0);
    }

    // dQ[kBlockM x kHeadDim] += dS K over this block's keys, kDqPasses column slices at a time.
    // The tile is staged in fp32 so the global adds below go out as whole 128-byte row segments
    // instead of 8 half-used sectors per instruction (the adds were a quarter of the run time).
    const int dq_wm = warp % T::kDqWarpsM, dq_wn = warp / T::kDqWarpsM;
    const int dq_row0 = dq_wm * T::kDqRows, dq_col0 = dq_wn * T::kDqCols;
    constexpr int kPassCols = T::kDqCols / T::kDqPasses;
    // The d256 A100-sized row's sm_80 SASS held two of the staging offsets across the loop (8
    // bytes of spill) unless the lane index is read again there; in sm_90 SASS the same re-read
    // made ptxas spill 16-28 bytes elsewhere, so only sm_80..sm_89 SASS takes it.
    constexpr bool kDqLaneReadHere = kHeadDim > 192 && !kLargeSmem && kSm80Sass;
    float* dq_tile = T::kDqBuffer ? smem.dq_stage : smem.stage[stage].dq();
    constexpr int kDqRowTiles = T::kDqRows / kMmaRows;
    // This warp's dS rows as A fragments, with dq_a_registers (a single unused step otherwise).
    uint32_t ds_frag[T::kDqARegisters ? kBlockN / kMmaK : 1][kDqRowTiles][4];
    if constexpr (T::kDqARegisters)
      load_at_fragments<kDqRowTiles, kBlockN, T::kDsPitch, Element>(ds_frag, smem_ds, lane_ds, dq_row0 / kMmaRows);
#pragma unroll
    for (int pass = 0; pass < T::kDqPasses; ++pass) {
      const int pass_col0 = dq_col0 + pass * kPassCols;
      float dq[kDqRowTiles][kPassCols / kMmaCols][4];
      if constexpr (T::kDqARegisters)
        warp_gemm_rtb<kDqRowTiles, kPassCols, kBlockN, kPitch, Element>(dq, ds_frag, smem_k, lane_tile,
                                                                         pass_col0 / (2 * kMmaCols));
      else
        warp_gemm_atb<kDqRowTiles, kPassCols, kBlockN, T::kDsPitch, kPitch, Element>(
            dq, smem_ds, lane_ds, dq_row0 / kMmaRows, smem_k, lane_tile, pass_col0 / (2 * kMmaCols));
      // Column warps read Q and dO, which a tile staged over them overwrites, until their dK and
      // dV are done.
      if (T::kScoresShared && !T::kDqBuffer && pass == 0) __syncthreads();
      stage_dq_fragments<kHeadDim, kDqLaneReadHere>(dq_tile, dq, dq_row0, pass_col0);
    }
    const int64_t row0 = m * kBlockM;
    float* dq_rows = ws.dq_acc + (ws_row - row0) * ws.dq_pitch;  // row 0 of (b, h)
    if (ws.dq_sem == nullptr) {
      if constexpr (T::kWarpDq) {
        // Each warp adds the region it staged; the next iteration's first barrier orders these
        // shared reads before the refill of this buffer.
        __syncwarp();
        warp_add_dq<kHeadDim, T::kDqRows, T::kDqCols, ptx::kHasVectorRed>(dq_rows, ws.dq_pitch, row0, dq_tile, dq_row0,
                                                                          dq_col0, cta.seq.len_q, p.head_dim);
      } else {
        __syncthreads();  // the whole tile is staged
        atomic_add_dq<kBlockM, kHeadDim, T::kWarps>(dq_rows, ws.dq_pitch, row0, dq_tile, cta.seq.len_q, p.head_dim);
      }
    } else {
      int32_t* sem = ws.dq_sem + ws_row / kBwdSemRows;
      const int64_t first = first_kv_block_of_query_block(p, m, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);
      ordered_add_dq<kBlockM, kHeadDim, T::kWarps>(dq_rows, ws.dq_pitch, row0, dq_tile, cta.seq.len_q, p.head_dim, sem,
                                                    static_cast<int32_t>(cta.n - first));
    }
    cur = next;
  }

  // Keys that no query sees keep their zero accumulators: dK = dV = 0 there. The CTA's
  // coordinates (split rows: read back from shared memory) and the sequence's offsets are worked
  // out again rather than kept live across the main loop (where they made ptxas spill them).
  // A part of a split item adds its dK/dV to the item's slot; the last part to finish stores the
  // sums. dK and dV go out through the K and V tiles, dead once every warp has left the loop, as
  // whole 16-byte chunks of contiguous rows -- except from the sm_80 SASS of the d256 A100 row,
  // whose main loop ptxas then allocated with 8 bytes of spill: it stores the fragments directly.
  constexpr bool kStagedOut = !(kSm80Sass && kHeadDim > 192 && !kLargeSmem);
  const BwdCta again = kSplit ? smem.kept_cta : bwd_cta<kMask, kSplit, kBlockN>(p, ws, schedule_shift);
  const SeqInfo seq = seq_info(p, again.b);
  const int64_t block_row0 = static_cast<int64_t>(again.n) * kBlockN;
  const int rows = seq.len_k - block_row0 < kBlockN ? static_cast<int>(seq.len_k - block_row0) : kBlockN;
  auto* dk = const_cast<Element*>(operand_base<Element>(p.dk, p.dk_stride, again.b, seq.k_start + block_row0, again.kvh));
  auto* dv = const_cast<Element*>(operand_base<Element>(p.dv, p.dv_stride, again.b, seq.k_start + block_row0, again.kvh));
  // Stages (or stores) this warp's dK, times the softmax scale, and dV for the key rows from row0.
  auto put_rows = [&](auto& dk_rows, auto& dv_rows, int row0) {
    constexpr int kRowTiles = sizeof(dk_rows) / sizeof(dk_rows[0]);
#pragma unroll
    for (int mi = 0; mi < kRowTiles; ++mi)
#pragma unroll
      for (int j = 0; j < kOutTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_rows[mi][j][e] *= p.scale;
    if constexpr (!kStagedOut) {
      store_c_rows(dk, p.dk_stride.row, dk_rows, row0, warp_col0, rows, p.head_dim);
      store_c_rows(dv, p.dv_stride.row, dv_rows, row0, warp_col0, rows, p.head_dim);
    } else if constexpr (T::kStmatrix) {
      store_c_tile_stsm<kPitch, Element>(smem.k, smem_k, lane_tile, dk_rows, row0, warp_col0);
      store_c_tile_stsm<kPitch, Element>(smem.v, smem_v, lane_tile, dv_rows, row0, warp_col0);
    } else {
      store_c_tile<kPitch>(smem.k, dk_rows, row0, warp_col0);
      store_c_tile<kPitch>(smem.v, dv_rows, row0, warp_col0);
    }
  };
  if constexpr (kStagedOut) __syncthreads();  // every warp is done reading K and V (the last dQ reads K)
  if (again.parts > 1) {
    float* slot = ws.split_acc + (again.item - ws.split_whole) * bwd_split_slot_floats<T>();
    if (!add_split_part<T::kThreads>(acc_dk, acc_dv, slot, ws.split_count + (again.item - ws.split_whole),
                                     again.parts))
      return;  // a later part stores the item's dK/dV
#pragma unroll
    for (int mi = 0; mi < kKeyTiles; ++mi) {
      float dk_sums[1][kOutTiles][4], dv_sums[1][kOutTiles][4];
      load_split_sums<T::kThreads, kKeyTiles, kOutTiles, false>(dk_sums[0], slot, mi);
      load_split_sums<T::kThreads, kKeyTiles, kOutTiles, true>(dv_sums[0], slot, mi);
      put_rows(dk_sums, dv_sums, warp_key0 + mi * kMmaRows);
    }
  } else {
    put_rows(acc_dk, acc_dv, warp_key0);
  }
  if constexpr (kStagedOut) {
    __syncthreads();
    store_tile<kBlockN, kHeadDim, kPitch, T::kThreads>(dk, p.dk_stride.row, smem.k, rows, p.head_dim);
    store_tile<kBlockN, kHeadDim, kPitch, T::kThreads>(dv, p.dv_stride.row, smem.v, rows, p.head_dim);
  }
}

// The most shared memory a CTA of the SASS being compiled can ever get. sm_80..sm_89 SASS runs
// only on GPUs with at most kSm80MaxSharedBytes, so a large-memory row (bwd_launch.cuh launches
// it only where it fits) can never run from it. Unless this compilation is also the PTX that the
// driver compiles for newer GPUs (cmake/cuda_instances.cmake passes FUSEDATTN_SM80_PTX_ARCH, the
// architecture of that PTX), such a row is left out there: it would only add a kernel that
// spills (d256: 40 bytes on sm_80; d64 12-20, d128 column 4) and can never run.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900 && defined(FUSEDATTN_SM80_PTX_ARCH) && FUSEDATTN_SM80_PTX_ARCH >= 90
constexpr int kBwdArchMaxSharedBytes = kSm80MaxSharedBytes;
#else
constexpr int kBwdArchMaxSharedBytes = kSm90MaxSharedBytes;
#endif

template <typename Element, int kHeadDim, MaskKind kMask, bool kLargeSmem>
__global__ void __launch_bounds__(BwdTile<kHeadDim, kLargeSmem>::kThreads, 1)
    bwd_main_kernel(const BwdParams p, const BwdWorkspace ws, int schedule_shift) {
  if constexpr (sizeof(BwdShared<Element, kHeadDim, kLargeSmem>) <= kBwdArchMaxSharedBytes)
    bwd_main<Element, kHeadDim, kMask, kLargeSmem>(p, ws, schedule_shift);
  else
    __trap();  // unreachable: no GPU that runs this SASS can give the CTA its shared memory
}

}  // namespace fusedattn::cuda::sm80
