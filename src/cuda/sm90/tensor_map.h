// Host-side construction of the TMA descriptors the Hopper forward kernel loads and stores with,
// and the one the Hopper backward adds dQ through.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "fusedattn/params.h"

namespace fusedattn::cuda::sm90 {

// One [batch, rows, heads, head_dim] operand with arbitrary (16-byte aligned) strides, described
// to the TMA as a 4-D tensor over (dim, row, head, batch), innermost first. The inner extent is
// the real head_dim, so a kernel instance for a larger head dim reads zeros past it and its
// stores drop those columns.
struct OperandView {
  const void* base;
  DType dtype;
  int64_t head_dim, rows, heads, batch;
  OperandStrides strides;  // in elements
};

// Operand `base` of a launch's tensors, `rows` rows per batch entry (the rows the maps cover,
// fwd_split.h's map_rows): a variable-length batch is one packed sequence to the TMA.
inline OperandView operand_view(const FwdParams& p, const void* base, int64_t rows, int heads,
                                const OperandStrides& strides) {
  return OperandView{base, p.dtype, p.head_dim, rows, heads, p.cu_seqlens_q != nullptr ? 1 : p.batch, strides};
}

// How far the L2 widens a map's loads that miss (the map's L2 promotion): to one 128-byte line or
// two. Every map takes 256 but the forward's K/V in decode steps (fwd_split.h, kv_l2_promotes_128b).
enum class L2Promotion { k128B, k256B };

// A tiled map with box [box_rows x box_cols] and the 128-byte swizzle (box_cols * element size
// must be 128; fp16, bf16 or fp32). Throws fusedattn::Error(kRuntime) when the driver rejects the description.
CUtensorMap make_tensor_map(const OperandView& view, int box_cols, int box_rows,
                            L2Promotion promotion = L2Promotion::k256B);

// The same operand as [batch, heads / group, rows, group, head_dim] (5-D, innermost last): the
// query heads of a GQA group side by side per row, so a box of [box_rows / group positions x
// group heads] lands as box_rows tiled rows, position-major (fwd_split.h, TiledRows). group must
// divide heads and box_rows; group = 1 is the plain operand.
CUtensorMap make_grouped_tensor_map(const OperandView& view, int group, int box_cols, int box_rows);

// The same operand with each row's head_dim seen as `slabs` slabs of slab_cols columns: 5-D over
// (column, row, slab, head, batch), innermost first, box [slabs x box_rows x slab_cols], so one
// TMA request moves box_rows whole rows, laid out in shared memory [slab][row][column] as the
// per-slab boxes of make_grouped_tensor_map (group 1) lie back to back. head_dim must be slabs *
// slab_cols.
CUtensorMap make_slab_tensor_map(const OperandView& view, int slabs, int slab_cols, int box_rows);

// The backward's fp32 dQ workspace at d64/d128: `rows` rows of `cols` floats, `pitch` floats
// apart (every (batch, head)'s padded rows back to back), for tensor reductions of [box_rows x
// box_cols] boxes (box_cols floats = 128 bytes) whose shared rows hold each group of eight rows
// interleaved (dq_rows.h: dq_staged_row, and the map's shape, dq_interleaved_map_shape). A box's
// coordinates are (column, 0, 0, first row / 8); rows (< 2^31), box_rows and a box's first row
// are multiples of 8.
CUtensorMap make_dq_tensor_map(const float* base, int64_t cols, int64_t rows, int64_t pitch, int box_cols, int box_rows);

}  // namespace fusedattn::cuda::sm90
