// Decode steps read key row by key row (decode.cpp): one query row per sequence and head, with K
// and V laid out so that a key's rows of every KV head lie side by side ([.., key, head, dim], as
// a KV cache in flash_attn's layout is).
#pragma once

#include "cpu/isa.h"
#include "fusedattn/params.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// Whether forward call p is such a step: one query row, no column mask, each key's K and V rows
// of all heads contiguous.
inline bool decodes_by_key_rows(const FwdParams& p) {
  return p.seqlen_q == 1 && p.column_mask == nullptr && p.view_group == 1 && p.k_stride.head == p.head_dim &&
         p.v_stride.head == p.head_dim;
}

void decode_by_key_rows(const FwdParams& p);

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
