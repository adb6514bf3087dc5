// The per-key-block summary of a column mask (common/column_mask.cuh says how the kernels read
// it), written by a small kernel before the attention kernel of a column-masked call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/params.h"

namespace fusedattn::cuda {

// Every summary holds two intervals per block; a mask of one interval has an empty second.
constexpr int kColumnSummaryIntervals = 2;
// Key blocks are at least this many keys (one m16 tile); the backward sizes its summary by it.
constexpr int kColumnSummaryMinBlockKeys = 16;

// The summary of one call's mask, as the kernels take it. bounds: [batch][mask heads][blocks]
// [kColumnSummaryIntervals] int4 of (least start, greatest start, least end, greatest end).
struct ColumnSummary {
  const int4* bounds = nullptr;
  int blocks = 0;  // key blocks per (batch, mask head)
};

// Bytes of the summary of p's column mask over key blocks of block_keys keys.
int64_t column_summary_bytes(const FwdParams& p, int block_keys);

// Writes that summary into `bounds` (column_summary_bytes of device memory) on p.stream.
ColumnSummary summarize_column_mask(const FwdParams& p, int block_keys, int4* bounds);

}  // namespace fusedattn::cuda
