// Scratch memory of the sm80 backward pass, carved from BwdParams::workspace.
//
// Everything is indexed per (sequence b, query head h, query row i within the sequence), with the
// row count padded to kBwdRowPad so that every kernel can load whole query blocks of lse/delta
// without bounds checks. Varlen batches use max_seqlen_q as the per-sequence row count, so the
// size is an upper bound on total_q rows (cu_seqlens live on the device and are not read here).
//
//   lse2    fp32 [B, Hq, rows]          lse * log2(e); +inf for padding rows and for lse = -inf
//                                       (fully masked rows), so exp2(s - lse2) is 0 there.
//   delta   fp32 [B, Hq, rows]          -rowsum(dO o O), the softmax-backward correction (negated:
//                                       the main kernel adds it)
//   dq_acc  fp32 [B, Hq, rows, dq_pitch] dQ accumulated across KV blocks (unscaled)
//   dq_sem  int32 [B, Hq, rows / kBwdSemRows]  deterministic mode only: how many KV blocks have
//           already added their share into that query block of dq_acc.
//   split_count int32 [split items]  calls that may split their last wave (bwd_split.h) only:
//               parts of that item done (the last one stores dK/dV)
//   split_acc   fp32 [split items, slot floats]  each split item's dK and dV, summed over its parts
//           The launcher zeroes the counters and the slots it uses, every call.
//   columns     int4 [B, mask heads, key blocks, 2]  column-masked calls only: the mask's per-block
//               summary (common/column_summary.h), sized for the smallest key block, written by
//               the launcher for its tile's.
//
// O(B*H*S) + O(B*H*S*D) bytes, plus O(SMs * block_n * D) for the split and O(B*H*S_k) for a column
// mask; nothing quadratic in the sequence length.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/column_summary.h"
#include "cuda/common/device.h"
#include "cuda/common/int_math.h"
#include "cuda/sm80/bwd_split.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

constexpr int64_t kBwdRowPad = 128;        // query rows per (b, h) round up to this (>= every kBlockM)
constexpr int64_t kBwdSemRows = 16;        // one dq semaphore per this many query rows
constexpr int64_t kBwdDqPitchMultiple = 8; // dq_acc rows start 32-byte aligned (8 floats)
constexpr std::size_t kBwdBufferAlign = 256;

struct BwdWorkspaceLayout {
  int64_t rows = 0;      // padded query rows per (b, h)
  int64_t dq_pitch = 0;  // floats per dq_acc row
  std::size_t lse2 = 0, delta = 0, dq_acc = 0, dq_sem = 0, split_acc = 0, split_count = 0, columns = 0;  // byte offsets
  int64_t split_items = 0;      // most split items the slots hold
  int64_t split_acc_floats = 0;  // floats of split_acc
  std::size_t total = 0;
};

inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p) {
  BwdWorkspaceLayout w;
  const int64_t sq = p.seqlen_q > 0 ? p.seqlen_q : 1;
  w.rows = round_up(sq, kBwdRowPad);
  w.dq_pitch = round_up(p.head_dim, kBwdDqPitchMultiple);
  const auto bh = static_cast<std::size_t>(p.batch > 0 ? p.batch : 0) * static_cast<std::size_t>(p.heads_q > 0 ? p.heads_q : 0);
  const std::size_t row_floats = bh * static_cast<std::size_t>(w.rows);
  std::size_t at = 0;
  w.lse2 = at;
  at = round_up(at + row_floats * sizeof(float), kBwdBufferAlign);
  w.delta = at;
  at = round_up(at + row_floats * sizeof(float), kBwdBufferAlign);
  w.dq_acc = at;
  at = round_up(at + row_floats * static_cast<std::size_t>(w.dq_pitch) * sizeof(float), kBwdBufferAlign);
  w.dq_sem = at;
  if (p.deterministic)
    at = round_up(at + row_floats / kBwdSemRows * sizeof(int32_t), kBwdBufferAlign);
  if (bwd_may_split(p)) {
    // The device the call runs on (backend.cu sizes and views the workspace under its guard).
    const int sms = device_attribute(cudaDevAttrMultiProcessorCount, p.device.index);
    const int64_t max_items = ceil_div(p.seqlen_k, kBwdSplitMinBlockN) * p.heads_kv * p.batch;
    const int64_t wave_items = int64_t{kBwdSplitMaxWaves} * kBwdSplitMaxCtasPerSm * sms;
    w.split_items = max_items < wave_items ? max_items : wave_items;
    const int64_t dim = round_up(p.head_dim, kBwdSplitDimGranule);
    w.split_acc_floats = w.split_items * 2 * kBwdSplitMaxBlockN * dim;  // dK and dV
    // The counters first: one memset from them through the slots a launch uses zeroes both.
    w.split_count = at;
    at = round_up(at + static_cast<std::size_t>(w.split_items) * sizeof(int32_t), kBwdBufferAlign);
    w.split_acc = at;
    at = round_up(at + static_cast<std::size_t>(w.split_acc_floats) * sizeof(float), kBwdBufferAlign);
  }
  if (p.column_mask != nullptr) {
    w.columns = at;
    at = round_up(at + static_cast<std::size_t>(column_summary_bytes(p, kColumnSummaryMinBlockKeys)), kBwdBufferAlign);
  }
  w.total = at;
  return w;
}

// Bytes of BwdParams::workspace the sm80 backward needs for this call.
inline std::size_t bwd_workspace_bytes(const BwdParams& p) { return bwd_workspace_layout(p).total; }

// The typed view the kernels take by value.
struct BwdWorkspace {
  float* lse2;
  float* delta;
  float* dq_acc;
  int32_t* dq_sem;  // null unless deterministic
  int64_t rows;
  int64_t dq_pitch;
  float* split_acc;      // null unless the call may split (bwd_split.h)
  int32_t* split_count;
  int64_t split_items;       // capacity of split_acc/split_count, in items
  int64_t split_acc_floats;  // capacity of split_acc
  // The launch's plan, set by the launcher (whole = every item and parts = 1 when unsplit).
  int split_whole = 0;
  int split_parts = 1;
  int4* column_bounds;    // null unless column-masked: room for the summary
  ColumnSummary columns;  // the summary over the launched tile's key blocks (the launcher's)

  // First padded row of (b, h) in lse2/delta; multiply by dq_pitch for dq_acc.
  FUSEDATTN_HD int64_t row_base(const FwdParams& p, int b, int h) const {
    return (static_cast<int64_t>(b) * p.heads_q + h) * rows;
  }
};

inline BwdWorkspace bwd_workspace_view(const BwdParams& p) {
  const BwdWorkspaceLayout w = bwd_workspace_layout(p);
  auto* base = static_cast<unsigned char*>(p.workspace);
  const bool split = w.split_items > 0;
  return {reinterpret_cast<float*>(base + w.lse2),
          reinterpret_cast<float*>(base + w.delta),
          reinterpret_cast<float*>(base + w.dq_acc),
          p.deterministic ? reinterpret_cast<int32_t*>(base + w.dq_sem) : nullptr,
          w.rows,
          w.dq_pitch,
          split ? reinterpret_cast<float*>(base + w.split_acc) : nullptr,
          split ? reinterpret_cast<int32_t*>(base + w.split_count) : nullptr,
          w.split_items,
          w.split_acc_floats,
          0,
          1,
          p.column_mask != nullptr ? reinterpret_cast<int4*>(base + w.columns) : nullptr,
          ColumnSummary{}};
}

}  // namespace fusedattn::cuda::sm80
