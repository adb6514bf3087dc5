// The Hopper backward main kernel: the sm80 kernel's algorithm (sm80/bwd_kernel.cuh) with every
// GEMM a warpgroup wgmma from shared memory, sm_90a only.
//
// One CTA owns KV block n (kBlockN keys) of (sequence b, KV head kvh) and keeps dK and dV in
// registers while it walks every (query head of the GQA group, query block that sees block n).
// At d64 and d128 warpgroup w owns the block's keys [64 w, 64 w + 64); both tiles work on
// transposed scores (d64's 128-query blocks in two passes of 64 queries up to dS^T):
//
//   S^T  = K_w Q^T                         wgmma SS (K, Q K-major)
//   dP^T = V_w dO^T                        wgmma SS (V, dO K-major)
//   P^T  = exp2(S^T * scale_log2 - lse2[query])   (lse2 = +inf where a row has no keys: P = 0)
//   dV  += P^T dO                          wgmma RS (P^T from registers, dO MN-major)
//   dS^T = P^T o (dP^T + delta[query])     (delta = -rowsum(dO o O), the preprocess kernel's)
//   dK  += dS^T Q                          wgmma RS (dS^T from registers, Q MN-major); d64: SS
//                                          (dS^T from shared memory, K-major)
//   dQ   = dS K                            wgmma SS (dS^T through shared memory, both MN-major),
//                                          a 64 x 64 tile per warpgroup (d128: its column slab,
//                                          d64: its half of the 128 queries) over the block's
//                                          keys, staged in shared memory and added to the fp32
//                                          workspace by TMA tensor reductions
//
// S^T and dP^T are issued together; P^T's exponentials run while dP^T's wgmmas do, and dV's
// while dS^T is formed. Warp specialised: a producer warpgroup (setmaxnreg's minimum,
// bwd_producer.cuh) has one thread load K and V once and each query block's Q, dO, lse2 and delta
// up to kStages blocks ahead, all by TMA onto mbarriers, and one warp add each block's dQ by TMA
// reductions; the two compute warpgroups meet only on a named barrier per block (dS^T complete),
// on mbarriers, and once at the end (both done with K and V, where dK and dV are staged).
// dK is scaled by the softmax scale once at the end, and dK and dV are staged in the K and V
// tiles and written by TMA stores; dQ is scaled by the convert kernel (sm80/bwd_convert.cu), which
// with the preprocess kernel and the workspace is the portable backward's.
//
// d256 (BwdTile::kSplitsColumns): one 64-key block shared by both warpgroups. Warpgroup w forms
// S^T, dP^T, P^T and dS^T for queries [32 w, 32 w + 32) of the block and writes P^T and dS^T to
// shared memory; after the named barrier it runs dV += P^T dO and dK += dS^T Q (wgmma SS, P^T
// and dS^T K-major, dO and Q MN-major) and dQ = dS K over columns [128 w, 128 w + 128). The tile
// has no room of its own to stage dQ: each warpgroup stages it in the stage's Q and dO slabs of
// its own columns once its dK and dV have read them, and the writer warp's TMA reductions add it
// to the workspace and give the stage back (BwdTile::kDqInStage).
#pragma once

#include <array>
#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/kinds.h"
#include "cuda/common/schedule.h"
#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/mufu.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/sync.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/sm80/bwd_mask.h"
#include "cuda/sm80/bwd_shared.cuh"
#include "cuda/sm80/bwd_tile_io.cuh"
#include "cuda/sm80/bwd_workspace.h"
#include "cuda/sm90/bwd_producer.cuh"
#include "cuda/sm90/bwd_tile.h"
#include "cuda/sm90/pipeline.cuh"  // RingUse
#include "cuda/sm90/swizzled_stmatrix.cuh"

namespace fusedattn::cuda::sm90 {

// The wgmma descriptors of one tile of BwdSharedStorage: [slab][kRows][64] with the 128-byte
// swizzle. K-major (rows = M or N): k-step kk of 16 head-dim columns is slab kk / 4, 32 bytes per
// step inside it. MN-major (rows = the reduction): k-step kk is 16 rows down; 64-column groups
// along M/N lie a slab (kRows rows) apart. A descriptor is the tile's low word (address and
// leading byte offset), re-read where it is used (ptx::value_here: hoisted, every k-step's
// descriptor stayed live across the loop), plus the encoded step offset, and a constant high
// word (ptx/wgmma.cuh).
template <int kRows>
struct SlabTile {
  static constexpr uint32_t kSlabBytes = kRows * kBwdRowBytes;
  static constexpr uint32_t kUnusedLbo = 16;  // K-major descriptors ignore it
  static constexpr uint32_t kKStepBytes = kBwdWgmmaK * 2;  // 16 elements of 16 bits
  static constexpr int kKStepsPerSlab = kBwdSlabElems / kBwdWgmmaK;
  uint32_t base;  // shared address of row 0 of slab 0

  __device__ __forceinline__ uint32_t k_major_word(int first_row) const {
    return ptx::value_here(ptx::desc_low_word(base + first_row * kBwdRowBytes, kUnusedLbo));
  }
  __device__ __forceinline__ uint32_t mn_major_word(int first_slab, int first_row) const {
    return ptx::value_here(ptx::desc_low_word(base + first_slab * kSlabBytes + first_row * kBwdRowBytes, kSlabBytes));
  }
  static __device__ __forceinline__ uint64_t k_major(uint32_t word, int kk) {
    const uint32_t step = (kk / kKStepsPerSlab) * kSlabBytes + (kk % kKStepsPerSlab) * kKStepBytes;
    return ptx::desc_from_words(word + static_cast<uint32_t>(ptx::desc_encode(step)), ptx::desc_high_word(kBwdAtomBytes));
  }
  static __device__ __forceinline__ uint64_t mn_major(uint32_t word, int kk) {
    const uint32_t step = kBwdWgmmaK * kk * kBwdRowBytes;
    return ptx::desc_from_words(word + static_cast<uint32_t>(ptx::desc_encode(step)), ptx::desc_high_word(kBwdAtomBytes));
  }
};

// The compute warpgroups' named barriers (id 0 is __syncthreads').
constexpr uint32_t kDsBarrier = 1;
constexpr uint32_t kKeyTilesReadBarrier = 2;  // the compute warpgroups are done with K and V
constexpr uint32_t kKeysStagedBarrier = 3;    // + w: warpgroup w staged its dK and dV

template <typename Element, int kHeadDim, MaskKind kMask>
__device__ __forceinline__ void bwd_main(const BwdParams& p, const sm80::BwdWorkspace& ws, int schedule_shift,
                                         const BwdMaps* maps) {
  using T = BwdTile<kHeadDim>;
  using Storage = BwdSharedStorage<Element, kHeadDim>;
  constexpr int kBlockM = T::kBlockM, kBlockN = T::kBlockN;
  constexpr int kAcc = T::kColumns / 2;          // dK/dV accumulator registers (64 rows x kColumns)
  constexpr int kScoreAcc = T::kScoreQueries / 2;  // S^T/dP^T registers (64 keys x kScoreQueries)
  using BlockPacked = std::array<uint32_t, kBlockM / 4>;  // P^T or dS^T of 64 keys x kBlockM, packed pairs
  constexpr int kDqAcc = T::kDqCols / 2;
  constexpr int kDimSteps = kHeadDim / kBwdWgmmaK;   // k-steps of S^T and dP^T
  constexpr int kQuerySteps = kBlockM / kBwdWgmmaK;  // k-steps of dV and dK
  constexpr int kKeySteps = kBlockN / kBwdWgmmaK;    // k-steps of dQ
  constexpr bool kWindowed = kMask == MaskKind::kWindow;
  static_assert(kMask != MaskKind::kColumn, "column masks run the portable backward");
  extern __shared__ __align__(kBwdAtomBytes) unsigned char smem_bytes[];
  Storage& smem = *reinterpret_cast<Storage*>(smem_bytes);

  // The CTA's item: as the portable kernel's unsplit grid (bwd_launch.cuh), KV block x, KV head
  // y, batch z; masked launches take the grouped order (lower KV blocks of a head first).
  const GridItem item = grid_item<kMask != MaskKind::kFull>(schedule_shift);
  sm80::BwdCoords cta;
  cta.n = item.rank;
  cta.kvh = item.y;
  cta.b = item.z;
  cta.group = p.heads_q / p.heads_kv;
  cta.seq = seq_info(p, cta.b);
  const int64_t key0 = cta.n * kBlockN;
  if (key0 >= cta.seq.len_k) return;  // varlen grids cover max_seqlen_k
  cta.m_blocks = sm80::query_blocks_of_kv_block(p, cta.n, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);
  cta.iterations = cta.m_blocks.empty() ? 0 : cta.group * static_cast<int>(cta.m_blocks.end - cta.m_blocks.begin);
  const sm80::BlockRange unmasked =
      sm80::unmasked_query_blocks(p, kWindowed, cta.n, kBlockM, kBlockN, cta.seq.len_q, cta.seq.len_k);

  const SlabTile<kBlockN> k_tile{ptx::smem_addr(smem.k)}, v_tile{ptx::smem_addr(smem.v)};
  using Cursor = sm80::QueryCursor<false>;
  const int blocks_per_head = static_cast<int>(cta.m_blocks.end - cta.m_blocks.begin);
  const Cursor first{cta.kvh * cta.group, Cursor::first_block(cta), blocks_per_head};

  constexpr int kComputeWarps = T::kMmaThreads / kBwdWarpSize;
  // dQ's staging boxes (BwdSharedStorage): their bytes, their count in dQ's 64-column slab and
  // in a warpgroup's tile.
  constexpr uint32_t kDqBoxBytes = Storage::kDqBoxBytes;
  constexpr int kBoxesPerDqSlab = Storage::kBoxesPerDqSlab;
  constexpr int kBoxesPerWarpgroup = Storage::kDqBoxesPerWarpgroup;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&smem.k_full, 1);
    ptx::mbarrier_init(&smem.v_full, 1);
    for (int i = 0; i < T::kStages; ++i) {
      ptx::mbarrier_init(&smem.q_full[i], 1);
      // d256: the writer warp gives the stage back, once its reductions have read the dQ staged there.
      ptx::mbarrier_init(&smem.q_empty[i], T::kDqInStage ? 1 : T::kMmaThreads);
      if constexpr (T::kDqInStage) ptx::mbarrier_init(&smem.dq_in_stage[i], T::kMmaThreads);
    }
    for (int i = 0; i < T::kDqBuffers; ++i) {
      ptx::mbarrier_init(&smem.dq_full[i], kComputeWarps);
      ptx::mbarrier_init(&smem.dq_empty[i], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: the roles meet on mbarriers and named barriers only

  const int lane = threadIdx.x % kBwdWarpSize;
  if (threadIdx.x < kBwdWarpgroupThreads) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    const int warp = threadIdx.x / kBwdWarpSize;
    const BwdProducer<Element, kHeadDim> producer{p, ws, maps, cta, first, smem};
    if (warp == kLoaderWarp && lane == 0) {
      producer.load_operands(key0);
    } else if (warp == kDqWriterWarp) {
      producer.write_dq(lane);
    }
  } else {
    ptx::setmaxnreg_inc<T::kMmaRegs>();

    const int mma_thread = threadIdx.x - kBwdWarpgroupThreads;
    const int wg = mma_thread / kBwdWarpgroupThreads;
    const int warp = mma_thread / kBwdWarpSize % kBwdWarpgroupWarps;
    const int g = lane / 4, t = lane % 4;  // the accumulator layout's row group and column pair
    const int row_in_wg = warp * kBwdAccRows + g;    // its accumulators' first row (and + 8)
    // The warpgroup's share of the block: at d64/d128 its 64 keys, at d256 its 32 queries of S^T
    // and dP^T and its 128 columns of dK, dV and dQ. A pass's queries start at q0: query0 at d256,
    // pass x kScoreQueries at d64/d128 (whose query0 is 0).
    const int key_row0 = T::kSplitsColumns ? 0 : wg * T::kWarpgroupKeys;
    const int query0 = T::kSplitsColumns ? wg * T::kScoreQueries : 0;
    const int col0 = T::kSplitsColumns ? wg * T::kColumns : 0;
    float dk[kAcc] = {}, dv[kAcc] = {};
    // A thread's pairs of a per-query vector (lse2, delta). Where T::kRowPairsAhead (d64) they are
    // read before the wait on the wgmma whose result they meet, so that their shared-memory latency
    // runs under it (read after it, the first exponent's FFMA stalled on the LDS: ncu, session 77);
    // elsewhere after it. Element 4j + e of a 64 x N accumulator is row row_in_wg + 8 (e / 2),
    // column 8j + 2t + e % 2 (ptx/wgmma.cuh).
    struct RowPairs {
      float2 v[kScoreAcc / 4];
    };
    auto load_row_pairs = [&](const float* rows, int q0) {
      RowPairs r;
#pragma unroll
      for (int j = 0; j < kScoreAcc / 4; ++j) r.v[j] = *reinterpret_cast<const float2*>(rows + q0 + 8 * j + 2 * t);
      return r;
    };
    // P^T = exp2(S^T * scale_log2 - lse2[query]) in place, masked where the block is.
    auto probabilities = [&](float (&sc)[kScoreAcc], const RowPairs& l2, int m, int q0) {
#pragma unroll
      for (int j = 0; j < kScoreAcc / 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sc[4 * j + e] = ptx::ex2_approx(fmaf(sc[4 * j + e], p.scale_log2, -(e % 2 ? l2.v[j].y : l2.v[j].x)));
      if (m < unmasked.begin || m >= unmasked.end) {
        const sm80::LaneMask mask = sm80::lane_mask(p, kWindowed, key0 + key_row0 + row_in_wg,
                                                    static_cast<int64_t>(m) * kBlockM + q0 + 2 * t,
                                                    cta.seq.len_q, cta.seq.len_k);
#pragma unroll
        for (int j = 0; j < kScoreAcc / 4; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!mask.visible(e / 2 * 8, 8 * j + e % 2)) sc[4 * j + e] = 0.f;
      }
    };
    // dS^T = P^T o (dP^T + delta[query]) in place of dP^T.
    auto score_grads = [&](float (&d)[kScoreAcc], const float (&pr)[kScoreAcc], const RowPairs& nd) {
#pragma unroll
      for (int j = 0; j < kScoreAcc / 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[4 * j + e] = pr[4 * j + e] * (d[4 * j + e] + (e % 2 ? nd.v[j].y : nd.v[j].x));
    };
    auto packed = [](const float (&x)[kScoreAcc]) {
      std::array<uint32_t, kScoreAcc / 2> r;
#pragma unroll
      for (int i = 0; i < kScoreAcc / 2; ++i) r[i] = pack2<Element>(x[2 * i], x[2 * i + 1]);
      return r;
    };
    // Packed pairs into a [query slab][key][64 queries] tile (P^T, dS^T): key key_row0 + row_in_wg
    // (+ 8), query chunk j of the pass's queries from q0 (which lie in one slab), at
    // swizzle_chunk(row, chunk) = chunk ^ (row % 8) of the 128-byte swizzle. For one j the warp's
    // 32 stores hit 32 distinct banks.
    static_assert(T::kScoreQueries <= kBwdSlabElems && kBwdSlabElems % T::kScoreQueries == 0,
                  "a pass's queries lie in one slab of the tile");
    auto store_transposed = [&](uint32_t tile, const std::array<uint32_t, kScoreAcc / 2>& x, int q0) {
      constexpr int kChunkBytes = 16, kChunkElems = kChunkBytes / sizeof(Element);
      const uint32_t slab = tile + q0 / kBwdSlabElems * SlabTile<kBlockN>::kSlabBytes;
#pragma unroll
      for (int j = 0; j < kScoreAcc / 4; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = key_row0 + row_in_wg + 8 * half, chunk = q0 % kBwdSlabElems / kChunkElems + j;
          const uint32_t at = slab + row * kBwdRowBytes + swizzle_chunk(row, chunk) * kChunkBytes + t * sizeof(uint32_t);
          ptx::st_shared_b32(at, x[2 * j + half]);
        }
    };
    // This warpgroup's 64 keys x kColumns accumulator (dK or dV) times `scale`, as elements into
    // its rows (from key_row0) and columns (from col0, a slab's first) of a K/V tile, swizzled as
    // the TMA loaded it (swizzled_stmatrix.cuh, as the forward's epilogue).
    auto stage_keys = [&](const Element* tile, const float (&acc)[kAcc], float scale) {
      using Stmatrix = SwizzledStmatrix<Element>;
      static_assert(T::kColumns % kBwdSlabElems == 0, "a warpgroup's columns start on a slab");
      const int row = Stmatrix::row(key_row0 + warp * kBwdAccRows, lane);
      const uint32_t row_address =
          ptx::smem_addr(tile) + col0 / kBwdSlabElems * SlabTile<kBlockN>::kSlabBytes + row * kBwdRowBytes;
      Stmatrix::store(row_address, Stmatrix::lane_chunk(lane), kBlockN * kBwdSlabElems, acc, scale);
    };
    // acc (64 keys x kColumns) += A (64 keys x kBlockM queries: P^T or dS^T, from registers) x B
    // (the block's dO or Q, MN-major): k-step kk takes the chunks of queries 16kk..16kk+15.
    auto issue_rs = [](auto& acc, const BlockPacked& a, const SlabTile<kBlockM>& b) {
      ptx::wgmma_fence();
      const uint32_t b_word = b.mn_major_word(0, 0);
#pragma unroll
      for (int kk = 0; kk < kQuerySteps; ++kk) {
        const uint32_t step[4] = {a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3]};
        ptx::wgmma_rs<Element, T::kColumns>(acc, step, SlabTile<kBlockM>::mn_major(b_word, kk), true);
      }
      ptx::wgmma_commit_group();
    };
    // acc (64 keys x this warpgroup's kColumns) += A (its 64 keys x kBlockM queries, P^T or dS^T
    // in shared memory, K-major) x B (dO or Q, its columns, MN-major): d256's dV and dK, d64's dK.
    auto issue_ss = [&](auto& acc, const SlabTile<kBlockN>& a, const SlabTile<kBlockM>& b) {
      const uint32_t a_word = a.k_major_word(key_row0), b_word = b.mn_major_word(col0 / kBwdSlabElems, 0);
#pragma unroll
      for (int kk = 0; kk < kQuerySteps; ++kk)
        ptx::wgmma_ss_bmn<Element, T::kColumns>(acc, SlabTile<kBlockN>::k_major(a_word, kk),
                                                SlabTile<kBlockM>::mn_major(b_word, kk), true);
    };
    // acc (64 keys x kScoreQueries) = A (64 keys of K or V from key_row0, K-major) x B^T (the
    // block's Q or dO rows from q0, K-major) over the head dim: S^T or dP^T, one commit group.
    auto issue_scores = [&](float (&acc)[kScoreAcc], const SlabTile<kBlockN>& a, const SlabTile<kBlockM>& b, int q0) {
      const uint32_t a_word = a.k_major_word(key_row0), b_word = b.k_major_word(q0);
#pragma unroll
      for (int kk = 0; kk < kDimSteps; ++kk)
        ptx::wgmma_ss<Element, T::kScoreQueries>(acc, SlabTile<kBlockN>::k_major(a_word, kk),
                                                 SlabTile<kBlockM>::k_major(b_word, kk), kk > 0);
      ptx::wgmma_commit_group();
    };
    // acc (64 queries x one 64-column slab of K from column c0) = dS K over the block's keys, one
    // commit group: dS^T's rows are keys, so dS is M-major (ds_word: the dS^T tile's
    // mn_major_word(the queries' slab, 0)); K's rows are keys too, so it is N-major. A
    // warpgroup's dQ is one such slab at d64/d128, two at d256.
    auto issue_dq = [&](float (&acc)[kBwdSlabElems / 2], uint32_t ds_word, int c0) {
      ptx::wgmma_fence();
      const uint32_t k_word = k_tile.mn_major_word(c0 / kBwdSlabElems, 0);
#pragma unroll
      for (int kk = 0; kk < kKeySteps; ++kk)
        ptx::wgmma_ss_mn<Element, kBwdSlabElems>(acc, SlabTile<kBlockN>::mn_major(ds_word, kk),
                                                 SlabTile<kBlockN>::mn_major(k_word, kk), kk > 0);
      ptx::wgmma_commit_group();
    };
    // One 64-column slab of dQ accumulators into the two boxes from first_box (fp32, once the
    // boxes' last reads are done): the pair of accumulator chunk j sits at column 8j + 2t of rows
    // row_in_wg (+ 8): box j / 4, 16-byte chunk 2 (j % 4) + t / 2 of its staged row
    // (dq_staged_row, swizzled by it), half t % 2.
    auto stage_dq = [&](uint32_t first_box, const float (&acc)[kBwdSlabElems / 2]) {
      constexpr int kChunksPerJ = 4;
      constexpr uint32_t kChunkBytes = 16, kPairBytes = 2 * sizeof(float);
      // The row's place in its group of 8, from g rather than row_in_wg: so ptxas still sees the
      // swizzle phase is g's, and the plain order (d256) compiles as it did before the interleave.
      const int staged_g = dq_staged_row(g, T::kDqInterleaved);
      const uint32_t thread_at = first_box + (row_in_wg - g + staged_g) * kBwdRowBytes + t % 2 * kPairBytes;
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int j = 0; j < kBwdSlabElems / 8; ++j) {
          const uint32_t at = thread_at + (j / kChunksPerJ) * kDqBoxBytes + half * 8 * kBwdRowBytes +
                              swizzle_chunk(staged_g, 2 * (j % kChunksPerJ) + t / 2) * kChunkBytes;
          ptx::st_shared_v2_f32(at, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
    };
    static_assert(!T::kSplitsColumns || T::kDqCols == 2 * kBwdSlabElems, "d256's dQ is two slabs per warpgroup");

    // d64/d128: the dQ of block `it`, staged by this warp, handed to the writer warp once its
    // stores are visible to the async proxy. That is done after the next block's S^T/dP^T issue,
    // so that the fence waits for the stores under those wgmmas: right after the stores it was
    // ~10% of d64's stall samples (ncu at full 8k).
    auto hand_over_dq = [&](int it) {
      ptx::fence_proxy_async_shared();
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&smem.dq_full[RingUse<T::kDqBuffers>(it).slot]);
    };

    // The TMA writes and wgmma reads through the async proxy alike: no proxy fence after the waits.
    if (cta.iterations > 0) ptx::mbarrier_wait(&smem.k_full, 0);
    // V lands after the first block's Q and dO: waited for before the first dP^T's issue. The
    // fence after the branch keeps ptxas from inserting its own before dP^T's wgmmas (C7519).
    auto await_v = [&](int it) {
      if (it == 0) ptx::mbarrier_wait(&smem.v_full, 0);
      ptx::wgmma_fence();
    };
    Cursor cur = first;
    for (int it = 0; it < cta.iterations; ++it, cur.advance(cta)) {
      const RingUse<T::kStages> use(it);
      const int stage = use.slot;
      ptx::mbarrier_wait(&smem.q_full[stage], use.full_parity);
      const SlabTile<kBlockM> q_tile{ptx::smem_addr(smem.stage[stage].q)};
      const SlabTile<kBlockM> do_tile{ptx::smem_addr(smem.stage[stage].dout)};
      const SlabTile<kBlockN> ds_tile{ptx::smem_addr(smem.ds[it % 2])};
      const float* lse2 = smem.rows[stage].lse2;
      const float* delta = smem.rows[stage].delta;

      if constexpr (T::kSplitsColumns) {
        // d256: S^T = K Q^T and dP^T = V dO^T over this warpgroup's queries, one commit group
        // each; P^T and dS^T of them into shared memory; after a barrier of both warpgroups, dV
        // += P^T dO and dK += dS^T Q over this warpgroup's columns.
        float s[kScoreAcc], dp[kScoreAcc];
        ptx::wgmma_fence();
        issue_scores(s, k_tile, q_tile, query0);
        await_v(it);
        issue_scores(dp, v_tile, do_tile, query0);
        static_assert(!T::kRowPairsAhead, "d256 reads its row pairs after the waits");
        ptx::wgmma_wait_group<1>();
        ptx::fence_operands(s);
        probabilities(s, load_row_pairs(lse2, query0), cur.m, query0);
        const SlabTile<kBlockN> pt_tile{ptx::smem_addr(smem.scratch.buf[it % 2])};
        store_transposed(pt_tile.base, packed(s), query0);
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(dp);
        score_grads(dp, s, load_row_pairs(delta, query0));
        store_transposed(ds_tile.base, packed(dp), query0);
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(kDsBarrier, T::kMmaThreads);

        // dQ = dS K over this warpgroup's columns, one 64-column slab of K at a time (all 128
        // columns' fp32 beside dK's and dV's spilled), staged in the stage (kDqInStage): slab 0
        // in this warpgroup's Q slabs once dK has read them, under dV; slab 1 in its dO slabs
        // once dV has. The S^T/dP^T reads of both warpgroups ended before the barrier above.
        const uint32_t ds_word = ds_tile.mn_major_word(0, 0);
        const int box0 = wg * kBoxesPerWarpgroup;
        float dq[kBwdSlabElems / 2];
        issue_dq(dq, ds_word, col0);
        issue_ss(dk, ds_tile, q_tile);
        ptx::wgmma_commit_group();
        issue_ss(dv, pt_tile, do_tile);
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<1>();  // dQ's slab 0 and dK
        ptx::fence_operands(dq);
        ptx::fence_operands(dk);
        stage_dq(smem.dq_box_in_stage(stage, box0), dq);
        issue_dq(dq, ds_word, col0 + kBwdSlabElems);
        ptx::wgmma_wait_group<0>();  // dV and dQ's slab 1
        ptx::fence_operands(dq);
        ptx::fence_operands(dv);
        stage_dq(smem.dq_box_in_stage(stage, box0 + kBoxesPerDqSlab), dq);
        // To the writer warp, visible to its reductions (the async proxy). This thread's reads of
        // the stage's lse2 and delta are done too, and the writer gives the stage back: each
        // compute thread arrives for its own, as on q_empty at d64/d128.
        ptx::fence_proxy_async_shared();
        ptx::mbarrier_arrive(&smem.dq_in_stage[stage]);
      } else {
        // S^T = K Q^T and dP^T = V dO^T over the warpgroup's keys, one commit group each, in passes
        // of kScoreQueries queries; P^T packed for dV, dS^T = P^T o (dP^T + delta[query]) to shared
        // memory (dQ's A, and d64's dK's) and at d128 to registers (dK's A).
        BlockPacked pt;
        [[maybe_unused]] BlockPacked dst;  // d128's dK operand
        // d64 (T::kRowPairsAhead): every pass's lse2 pairs are read under pass 0's S^T, so that
        // the later passes' reads do not queue behind pass 0's dS^T stores (+0.5-4.2%, session 78).
        [[maybe_unused]] RowPairs lse_ahead[T::kScorePasses];
        // d128 (T::kLseBeforeIssue): its one pass's lse2 pairs before the S^T/dP^T issue.
        if constexpr (T::kLseBeforeIssue) {
          static_assert(T::kScorePasses == 1, "one pass reads its pairs before the issue");
          lse_ahead[0] = load_row_pairs(lse2, 0);
        }
#pragma unroll
        for (int pass = 0; pass < T::kScorePasses; ++pass) {
          const int q0 = pass * T::kScoreQueries;
          constexpr int kPassPacked = kScoreAcc / 2;
          float s[kScoreAcc], dp[kScoreAcc];
          ptx::wgmma_fence();
          issue_scores(s, k_tile, q_tile, q0);
          if (pass == 0) await_v(it);
          issue_scores(dp, v_tile, do_tile, q0);
          if (pass == 0 && it > 0) hand_over_dq(it - 1);
          if constexpr (T::kRowPairsAhead)
            if (pass == 0)
#pragma unroll
              for (int ps = 0; ps < T::kScorePasses; ++ps) lse_ahead[ps] = load_row_pairs(lse2, ps * T::kScoreQueries);

          ptx::wgmma_wait_group<1>();
          ptx::fence_operands(s);
          probabilities(s, T::kRowPairsAhead || T::kLseBeforeIssue ? lse_ahead[pass] : load_row_pairs(lse2, q0), cur.m, q0);
          const auto pt_pass = packed(s);
#pragma unroll
          for (int i = 0; i < kPassPacked; ++i) pt[pass * kPassPacked + i] = pt_pass[i];
          // dV += P^T dO once every pass's P^T is packed: in one pass under dP^T's wgmmas, else
          // under the last pass's dS^T.
          if constexpr (T::kScorePasses == 1) issue_rs(dv, pt, do_tile);
          RowPairs nd;
          if constexpr (T::kRowPairsAhead) nd = load_row_pairs(delta, q0);
          ptx::wgmma_wait_group<T::kScorePasses == 1 ? 1 : 0>();
          ptx::fence_operands(dp);
          if constexpr (T::kScorePasses > 1)
            if (pass == T::kScorePasses - 1) issue_rs(dv, pt, do_tile);
          if constexpr (!T::kRowPairsAhead) nd = load_row_pairs(delta, q0);
          score_grads(dp, s, nd);
          const auto ds_pass = packed(dp);
          store_transposed(ds_tile.base, ds_pass, q0);
          if constexpr (!T::kDkFromShared)
#pragma unroll
            for (int i = 0; i < kPassPacked; ++i) dst[pass * kPassPacked + i] = ds_pass[i];
        }

        // This warpgroup's dQ tile = dS K over the block's keys (issue_dq), then dK += dS^T Q, so
        // that dQ is staged while dK's wgmmas run (issued the other way round, the wait for both
        // was 7-12% of the stall samples; this order: d64 full 8k +1.7%, d128 +0.9-1.5%). Both
        // warpgroups' dS^T rows must be in shared memory and visible to the async proxy first.
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(kDsBarrier, T::kMmaThreads);
        float dq[kDqAcc];
        issue_dq(dq, ds_tile.mn_major_word(T::dq_row0(wg) / kBwdSlabElems, 0), T::dq_col0(wg));
        if constexpr (T::kDkFromShared) {
          issue_ss(dk, ds_tile, q_tile);
          ptx::wgmma_commit_group();
        } else {
          issue_rs(dk, dst, q_tile);
        }
        ptx::wgmma_wait_group<1>();  // dV and dQ
        ptx::fence_operands(dq);

        // dQ staged in fp32 as the boxes of its tensor reductions (the writer warp's), 128-byte
        // swizzled (a warp's 8 rows spread over the banks), in the warpgroup's boxes of buffer
        // it % kDqBuffers once the writer's reductions have read the block's before it there.
        static_assert(Storage::kDqSlabFloats == 32 && T::kDqCols == kBwdSlabElems, "a warpgroup's dQ is one slab of two boxes");
        const RingUse<T::kDqBuffers> dq_use(it);
        const int buf = dq_use.slot;
        ptx::mbarrier_wait(&smem.dq_empty[buf], dq_use.empty_parity());
        stage_dq(ptx::smem_addr(smem.scratch.slab[buf][wg * kBoxesPerWarpgroup]), dq);
        // Handed over after the next block's S^T/dP^T issue (hand_over_dq): there, rather than
        // after the softmax, since the writer's reductions must read the staging before the next
        // block's dQ can be staged (handed over after the probabilities: d64 -20%, d128 -10%).

        // Every wgmma of this warp's warpgroup on the stage's Q and dO has completed, and this
        // thread's reads of its lse2 and delta are done: each compute thread arrives for its own.
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(dk);
        ptx::fence_operands(dv);
        ptx::mbarrier_arrive(&smem.q_empty[stage]);
      }
    }
    if constexpr (T::kDqStaged)
      if (cta.iterations > 0) hand_over_dq(cta.iterations - 1);

    // dK (times the softmax scale) and dV of this warpgroup's keys; keys no query sees keep their
    // zeros. Written by 4-byte stores straight from the accumulators, the epilogue was ~23% of
    // d128's stall samples at full 512 (ncu, sixty-fifth session): with one CTA an SM nothing
    // runs beside it. So they are staged in the K and V tiles, free once both warpgroups' last
    // wgmmas have read them (dQ = dS K reads every key of K), and written by TMA stores of 64 keys
    // x one slab, which run on after the CTA's threads are done. A variable-length batch's rows
    // past a sequence's end are the next sequence's, which the TMA cannot clip: a warpgroup whose
    // keys reach past its sequence's end stores from its registers.
    const int64_t rows = cta.seq.len_k - key0;
    ptx::named_barrier_sync(kKeyTilesReadBarrier, T::kMmaThreads);
    if (!packs_sequences(p) || key_row0 + T::kWarpgroupKeys <= rows) {
      stage_keys(smem.k, dk, p.scale);
      stage_keys(smem.v, dv, 1.f);
      // Generic stores -> the TMA's (async proxy) reads: a fence in every writing thread, then meet.
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(kKeysStagedBarrier + wg, kBwdWarpgroupThreads);
      if (mma_thread % kBwdWarpgroupThreads == 0) {
        const int key_row = static_cast<int>(cta.seq.k_start + key0) + key_row0;
        const int batch = map_batch(p, cta.b);
#pragma unroll
        for (int slab = col0 / kBwdSlabElems; slab < (col0 + T::kColumns) / kBwdSlabElems; ++slab) {
          const int at = (slab * kBlockN + key_row0) * kBwdSlabElems;
          ptx::tma_store_4d(&maps->dk, smem.k + at, slab * kBwdSlabElems, key_row, cta.kvh, batch);
          ptx::tma_store_4d(&maps->dv, smem.v + at, slab * kBwdSlabElems, key_row, cta.kvh, batch);
        }
        ptx::tma_store_commit();
        ptx::tma_store_wait_read();  // the CTA's shared memory must outlive the stores' reads
      }
      return;
    }
    auto* dk_out = const_cast<Element*>(sm80::operand_base<Element>(p.dk, p.dk_stride, cta.b, cta.seq.k_start + key0, cta.kvh));
    auto* dv_out = const_cast<Element*>(sm80::operand_base<Element>(p.dv, p.dv_stride, cta.b, cta.seq.k_start + key0, cta.kvh));
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = key_row0 + row_in_wg + 8 * half;
      if (r >= rows) continue;
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        const int col = col0 + 8 * j + 2 * t;
        if (col >= p.head_dim) continue;
        *reinterpret_cast<uint32_t*>(dk_out + r * p.dk_stride.row + col) =
            pack2<Element>(dk[4 * j + 2 * half] * p.scale, dk[4 * j + 2 * half + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_out + r * p.dv_stride.row + col) =
            pack2<Element>(dv[4 * j + 2 * half], dv[4 * j + 2 * half + 1]);
      }
    }
  }
}

template <typename Element, int kHeadDim, MaskKind kMask>
__global__ void __launch_bounds__(BwdTile<kHeadDim>::kThreads, 1)
    bwd_main_kernel(const BwdParams p, const sm80::BwdWorkspace ws, int schedule_shift,
                    const __grid_constant__ BwdMaps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  bwd_main<Element, kHeadDim, kMask>(p, ws, schedule_shift, &maps);
#endif
}

}  // namespace fusedattn::cuda::sm90
