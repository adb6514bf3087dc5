// Host launcher of the Hopper backward: the portable backward's preprocess kernel, the wgmma main
// kernel (bwd_kernel.cuh), the portable dQ convert, all on p.stream, with the portable backward's
// workspace (sm80/bwd_workspace.h). Instantiated once per (element, head dim, mask kind) in
// src/cuda/instances/; dispatch.cu sends column masks to the portable one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/int_math.h"
#include "cuda/common/kinds.h"
#include "cuda/common/schedule.h"
#include "cuda/sm80/bwd_aux.h"
#include "cuda/sm80/bwd_workspace.h"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/fwd_split.h"  // map_rows
#include "cuda/sm90/tensor_map.h"

namespace fusedattn::cuda::sm90 {

// The L2 promotion of the backward's Q, dO, K and V maps: 256 bytes (tensor_map.h). Every CTA of a
// (batch, KV head) reads the same Q and dO blocks, which the L2 serves again and again, as it serves
// prefill's K/V in the forward, where 128 bytes read even (docs/hopper.md, session 86); here too:
// H200, fp16, medians of five, 128 against 256 bytes -0.8 to +0.4% at d64/d128/d256 full 4k, d128
// causal 4k and d256 causal 16k (docs/hopper.md, session 87). FUSEDATTN_SM90_BWD_L2_128B=1 takes
// 128 bytes, for measurements.
inline L2Promotion bwd_l2_promotion() {
  return env_switch_or("FUSEDATTN_SM90_BWD_L2_128B", false) ? L2Promotion::k128B : L2Promotion::k256B;
}

template <typename Element, int kHeadDim, MaskKind kMask>
void launch_bwd_main(const BwdParams& p, const sm80::BwdWorkspace& ws, cudaStream_t stream) {
  using T = BwdTile<kHeadDim>;
  constexpr int kSharedBytes = static_cast<int>(sizeof(BwdSharedStorage<Element, kHeadDim>));
  static_assert(kSharedBytes <= kMaxSharedBytesPerBlock, "the backward's tile fits a CTA's shared memory");
  const auto kernel = bwd_main_kernel<Element, kHeadDim, kMask>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  const int64_t kv_blocks = ceil_div(p.seqlen_k, T::kBlockN);
  const dim3 grid(static_cast<unsigned>(kv_blocks), static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
  // Masked launches go in the portable kernel's grouped order: what one (batch, KV head) pair's
  // CTAs read again and again (its query heads' Q, dO and fp32 dQ rows) shares the L2.
  const int64_t pair_bytes = int64_t{p.heads_q / p.heads_kv} * p.seqlen_q * p.head_dim *
                             (2 * static_cast<int64_t>(sizeof(Element)) + static_cast<int64_t>(sizeof(float)));
  const int shift = kMask == MaskKind::kFull ? 0 : schedule_shift(pair_bytes, p.heads_kv * p.batch);
  // dQ's workspace for the kernel's tensor reductions, boxes of a warpgroup's dQ rows x 32 floats
  // (128 bytes, the swizzle's row): at d64/d128 every (batch, head)'s padded rows back to back,
  // the staged rows interleaved (dq_staged_row); at d256 [batch, heads, rows, head_dim].
  using Storage = BwdSharedStorage<Element, kHeadDim>;
  BwdMaps maps;
  if constexpr (T::kDqInterleaved) {
    maps.dq = make_dq_tensor_map(ws.dq_acc, p.head_dim, int64_t{p.batch} * p.heads_q * ws.rows, ws.dq_pitch,
                                 Storage::kDqSlabFloats, T::kDqRows);
  } else {
    const OperandStrides dq_strides{p.heads_q * ws.rows * ws.dq_pitch, ws.dq_pitch, ws.rows * ws.dq_pitch};
    maps.dq = make_tensor_map({ws.dq_acc, DType::kFloat32, p.head_dim, ws.rows, p.heads_q, p.batch, dq_strides},
                              Storage::kDqSlabFloats, T::kDqRows);
  }
  // Q, dO, K, V, dK and dV over the rows in use (map_rows: a variable-length batch's packed rows
  // as one sequence, the rows dispatch checked), boxes of one 64-column slab: rows and columns
  // past them read as zeros, and stores drop them.
  const auto [rows_q, rows_k] = map_rows(p);
  const L2Promotion promotion = bwd_l2_promotion();
  maps.q = make_tensor_map(operand_view(p, p.q, rows_q, p.heads_q, p.q_stride), kBwdSlabElems, T::kBlockM, promotion);
  maps.dout =
      make_tensor_map(operand_view(p, p.dout, rows_q, p.heads_q, p.do_stride), kBwdSlabElems, T::kBlockM, promotion);
  maps.k = make_tensor_map(operand_view(p, p.k, rows_k, p.heads_kv, p.k_stride), kBwdSlabElems, T::kBlockN, promotion);
  maps.v = make_tensor_map(operand_view(p, p.v, rows_k, p.heads_kv, p.v_stride), kBwdSlabElems, T::kBlockN, promotion);
  maps.dk = make_tensor_map(operand_view(p, p.dk, rows_k, p.heads_kv, p.dk_stride), kBwdSlabElems, T::kWarpgroupKeys);
  maps.dv = make_tensor_map(operand_view(p, p.dv, rows_k, p.heads_kv, p.dv_stride), kBwdSlabElems, T::kWarpgroupKeys);
  kernel<<<grid, T::kThreads, kSharedBytes, stream>>>(p, ws, shift, maps);
  FUSEDATTN_CHECK_LAUNCH();
}

template <typename Element, int kHeadDim, MaskKind kMask>
void run_bwd(const BwdParams& p) {
  sm80::run_bwd_around<Element>(p, launch_bwd_main<Element, kHeadDim, kMask>);
}

}  // namespace fusedattn::cuda::sm90
