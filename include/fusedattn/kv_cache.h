// Appending decode tokens to KV caches (flash_attn_with_kvcache's write), with the lengths left on
// the tensors' device: nothing is read on the host, so on a GPU the call never waits for the
// stream and can be captured in a CUDA graph. Each sequence's checks are made where it is written,
// and their outcome is left in `status` for the caller (the PyTorch binding turns it into its
// faults and NaN rows).
#pragma once

#include <cstdint>

#include "fusedattn/attention.h"

namespace fusedattn {

// What append_kv did with one sequence's new tokens.
enum class AppendStatus : int32_t {
  kAppended = 0,     // written
  kPastCache = 1,    // cache_seqlens[b] < 0, or the new tokens pass the sequence's positions: not written
  kPageOutside = 2,  // a block_table entry the new tokens land in names no page of the pools: not written
};

struct AppendKvArgs {
  // Written: per-sequence caches [B, S_cache, Hkv, D], or with block_table pools of pages
  // [num_pages, page_size, Hkv, D]. Any strides, the last dimension contiguous.
  TensorView k_cache, v_cache;
  TensorView k, v;            // the new tokens [B, S_new, Hkv, D], the caches' dtype
  TensorView cache_seqlens;   // int32 [B]: the positions sequence b holds; its token j goes at cache_seqlens[b] + j
  TensorView block_table;     // optional int32 [B, pages], entries contiguous: position p of sequence b is row
                              // p % page_size of page block_table[b][p / page_size]
  TensorView status;          // int32 [B], written: an AppendStatus per sequence
  Backend backend = Backend::kAuto;  // kAuto: the tensors' device decides
  void* stream = nullptr;            // cudaStream_t for the CUDA backend; null = default stream
};

// Validates the arguments (throws fusedattn::Error naming the one at fault), then writes every
// sequence whose tokens fit its positions and pages, and its status.
void append_kv(const AppendKvArgs& args);

}  // namespace fusedattn
