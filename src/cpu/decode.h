// Decode steps read key row by key row (decode.cpp): one query row per sequence and head, with K
// and V laid out so that a key's rows of every KV head lie side by side ([.., key, head, dim], as
// a KV cache in flash_attn's layout is).
#pragma once

#include "cpu/isa.h"
#include "fusedattn/params.h"
#include "fusedattn/tensor.h"  // dtype_size

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// Query heads per KV head up to which a decode step always reads key by key.
inline constexpr int kKeyRowsMaxGroup = 4;
// Beyond that group, the bytes of a key's K (or V) rows per query head of the group it needs:
// the tiled forward runs a group's query heads as rows of one tile, which pays off where a key's
// rows are short enough to be read nearly in order anyway (CLI, 2-core Zen 5: 32/1 heads d128
// fp32 and 16/2 heads d64 fp16 ran faster tiled, 32/4 heads d128 fp32 key by key; docs/perf.md,
// fifty-fourth session).
inline constexpr int64_t kKeyRowBytesPerGroupHead = 256;

// Whether forward call p is such a step: one query row, no column mask, each key's K and V rows
// of all heads contiguous, and a GQA group small enough or its key rows long enough.
inline bool decodes_by_key_rows(const FwdParams& p) {
  if (p.seqlen_q != 1 || p.column_mask != nullptr || p.view_group != 1 || p.k_stride.head != p.head_dim ||
      p.v_stride.head != p.head_dim)
    return false;
  const int group = p.heads_q / p.heads_kv;
  const int64_t row_bytes = int64_t{p.heads_kv} * p.head_dim * static_cast<int64_t>(dtype_size(p.dtype));
  return group <= kKeyRowsMaxGroup || row_bytes >= kKeyRowBytesPerGroupHead * group;
}

void decode_by_key_rows(const FwdParams& p);

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
