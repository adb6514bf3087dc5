// Host launcher of the sm80 backward: preprocess -> main kernel -> dQ convert, all on p.stream,
// all scratch in p.workspace (sized by bwd_workspace_bytes). Instantiated once per (element,
// head dim, mask kind) in src/cuda/instances/.
//
// Deterministic mode: the main kernel adds each KV block's dQ share in increasing KV-block order
// (a per-query-block semaphore in the workspace) instead of with fp32 atomics, so every run sums
// in the same order and the result is bit-identical. Cost: a CTA may wait for its predecessor on
// the same query block; KV blocks of one head start in order, so the waits form a pipeline and
// the slowdown is mostly visible when few (batch, head) pairs run at once.
//
// Full-mask launches split the items of their last wave into parts (bwd_split.h) where the plan's
// model says it pays. Switches (read at every call):
//   FUSEDATTN_BWD_TAIL_SPLIT=0  every item runs whole (A/B of the split)
//   FUSEDATTN_BWD_SM80_TILE=1   the A100-sized tile on every GPU (below)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"
#include "cuda/common/int_math.h"
#include "cuda/common/kinds.h"
#include "cuda/common/schedule.h"
#include "cuda/sm80/bwd_aux.h"
#include "cuda/sm80/bwd_column_spans.cuh"
#include "cuda/sm80/bwd_kernel.cuh"
#include "cuda/sm80/bwd_split.h"
#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda::sm80 {

// The tail split (bwd_split.h) of a full-mask launch of `shape` on this device's concurrent CTAs:
// `ws` with the plan filled in, and the split items' slots and counters zeroed on `stream`.
// Unsplit (every item whole) where the plan does not pay, the call may not split, or the
// workspace cannot hold it. kSharedBytes: the kernel's shared memory, which allows
// kBwdSplitMaxCtasPerSm CTAs per SM.
template <typename T, int kSharedBytes>
BwdWorkspace plan_bwd_split(const BwdParams& p, const BwdLaunchShape& shape, const BwdWorkspace& ws,
                            cudaStream_t stream) {
  // An SM's shared memory is at most the per-block limit plus the 1 KiB it reserves per CTA, so
  // a kernel that takes more than half of that runs one CTA per SM: the slots are the SMs.
  static_assert(kBwdSplitMaxCtasPerSm == 1 && 2 * kSharedBytes > kSm90MaxSharedBytes,
                "a split row takes more than half an SM's shared memory");
  BwdWorkspace out = ws;
  out.split_whole = static_cast<int>(shape.items);
  out.split_parts = 1;
  if (ws.split_acc == nullptr) return out;  // bwd_may_split(p) is false
  const int64_t slots = current_device_attribute(cudaDevAttrMultiProcessorCount);
  const TailSplit plan = bwd_tail_split(p, shape, slots);
  const int64_t split_items = plan.split_items(shape.items);
  const int64_t slot_floats = bwd_split_slot_floats<T>();
  if (plan.parts == 1 || split_items > ws.split_items || split_items * slot_floats > ws.split_acc_floats) return out;
  // The counters lie just before the slots (bwd_workspace.h): one memset zeroes both.
  auto* first = reinterpret_cast<unsigned char*>(ws.split_count);
  auto* end = reinterpret_cast<unsigned char*>(ws.split_acc + split_items * slot_floats);
  FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(first, 0, static_cast<std::size_t>(end - first), stream));
  out.split_whole = static_cast<int>(plan.whole);
  out.split_parts = plan.parts;
  return out;
}

template <typename Element, int kHeadDim, MaskKind kMask, bool kLargeSmem>
void launch_bwd_main(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream) {
  using T = BwdTile<kHeadDim, kLargeSmem>;
  constexpr int kSharedBytes = static_cast<int>(sizeof(BwdShared<Element, kHeadDim, kLargeSmem>));
  static_assert(kSharedBytes <= (kLargeSmem ? kSm90MaxSharedBytes : kSm80MaxSharedBytes),
                "backward tile does not fit the shared memory of its GPUs");
  const auto kernel = bwd_main_kernel<Element, kHeadDim, kMask, kLargeSmem>;
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  // The CTAs' order (bwd_cta): lower KV blocks of a head start first, as the deterministic
  // mode's ordered dQ adds need. What one (batch, KV head) pair's CTAs read again and again: its
  // query heads' Q and dO rows and their fp32 dQ accumulator rows.
  if constexpr (kMask == MaskKind::kFull && bwd_row_splits(kHeadDim, kLargeSmem)) {
    const BwdLaunchShape shape = bwd_launch_shape(p, T::kBlockM, T::kBlockN);
    const BwdWorkspace split_ws = plan_bwd_split<T, kSharedBytes>(p, shape, ws, stream);
    const TailSplit plan{split_ws.split_whole, split_ws.split_parts};
    const dim3 grid(static_cast<unsigned>(plan.ctas(shape.items)));
    kernel<<<grid, T::kThreads, kSharedBytes, stream>>>(p, split_ws, 0);
  } else {
    BwdWorkspace masked_ws = ws;
    if constexpr (kMask == MaskKind::kColumn) {
      static_assert(T::kBlockN >= kColumnSummaryMinBlockKeys, "the workspace sizes the summary by the smallest block");
      static_assert(T::kBlockN <= kColumnSummaryMaxBlockKeys, "a block's run ends fit their bytes");
      masked_ws.columns = summarize_column_mask(p, T::kBlockN, ws.column_bounds);
      if (p.deterministic) {
        mark_growing_spans(p, ws.column_bounds, masked_ws.columns.blocks);
        start_column_turns<T::kBlockM, T::kBlockN>(p, masked_ws, stream);
      }
    }
    const int64_t kv_blocks = ceil_div(p.seqlen_k, T::kBlockN);
    const dim3 grid(static_cast<unsigned>(kv_blocks), static_cast<unsigned>(p.heads_kv),
                    static_cast<unsigned>(p.batch));
    const int64_t pair_bytes = int64_t{p.heads_q / p.heads_kv} * p.seqlen_q * p.head_dim *
                               (2 * static_cast<int64_t>(sizeof(Element)) + static_cast<int64_t>(sizeof(float)));
    const int shift = kMask == MaskKind::kFull ? 0 : schedule_shift(pair_bytes, p.heads_kv * p.batch);
    kernel<<<grid, T::kThreads, kSharedBytes, stream>>>(p, masked_ws, shift);
  }
  FUSEDATTN_CHECK_LAUNCH();
}

// FUSEDATTN_BWD_SM80_TILE=1 keeps the default (A100-sized) tile on every GPU, so the tests cover
// that kernel on Hopper too; also an A/B switch.
inline bool sm80_tile_forced() {
  const char* env = std::getenv("FUSEDATTN_BWD_SM80_TILE");
  return env && env[0] == '1';
}

// The large-memory tile where the head dim has one and the current device fits it (Hopper),
// the default tile otherwise; only the head dims with two rows compile two kernels.
template <typename Element, int kHeadDim, MaskKind kMask>
void launch_bwd_main_for_device(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream) {
  if constexpr (bwd_has_large_smem_tile(kHeadDim)) {
    if (sm80_tile_forced()) {
      launch_bwd_main<Element, kHeadDim, kMask, false>(p, ws, stream);
      return;
    }
    const int optin = current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    if (sizeof(BwdShared<Element, kHeadDim, true>) <= static_cast<std::size_t>(optin)) {
      launch_bwd_main<Element, kHeadDim, kMask, true>(p, ws, stream);
      return;
    }
  }
  launch_bwd_main<Element, kHeadDim, kMask, false>(p, ws, stream);
}

template <typename Element, int kHeadDim, MaskKind kMask>
void run_bwd(const BwdParams& p) {
  run_bwd_around<Element>(p, launch_bwd_main_for_device<Element, kHeadDim, kMask>);
}

}  // namespace fusedattn::cuda::sm80
