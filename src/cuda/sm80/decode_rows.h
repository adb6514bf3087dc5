// Decoding with grouped heads on the portable forward: one query row per sequence and g query
// heads per KV head. Run as is, each of the g heads is a CTA of one row that reads the whole K/V
// of its KV head, so the group's K/V crosses the memory system g times. Viewed as g rows of one
// head (the query heads of a group are consecutive, so the head stride steps from row to row),
// one CTA reads it once. Exact where every row sees the same keys: a full mask, which a causal
// mask of one query row folds into (params.h, fold_unbounded_window). The LSE's row stride is
// always 1 in the kernels, so the view needs heads 1 apart there too (a [B, H, 1] LSE).
// FlashAttention-2 swaps the same way for its decode (seqlen_q == 1 with GQA).
// FUSEDATTN_SM80_DECODE_ROWS=0 turns the view off (A/B measurements).
#pragma once

#include "cuda/common/env.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

inline FwdParams decode_groups_as_rows(const FwdParams& p) {
  const bool dense = p.cu_seqlens_q == nullptr;
  const int group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  const bool lse_fits = p.lse == nullptr || p.lse_head_stride == 1;
  if (!dense || p.seqlen_q != 1 || group <= 1 || p.is_masked() || !lse_fits) return p;
  if (!env_switch_or("FUSEDATTN_SM80_DECODE_ROWS", true)) return p;
  FwdParams rows = p;
  rows.seqlen_q = group;
  rows.heads_q = p.heads_kv;
  rows.q_stride.row = p.q_stride.head;
  rows.q_stride.head = p.q_stride.head * group;
  rows.o_stride.row = p.o_stride.head;
  rows.o_stride.head = p.o_stride.head * group;
  rows.lse_head_stride = p.lse_head_stride * group;
  return rows;
}

}  // namespace fusedattn::cuda::sm80
