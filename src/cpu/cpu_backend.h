// The CPU backend: the FlashAttention-2 algorithm itself (tiled, online softmax, LSE saved),
// multithreaded over (batch, head, query block). Inputs are validated by src/api before these
// are called; sizes may be zero-length on the key side (every row then fully masked).
#pragma once

#include "fusedattn/params.h"

namespace fusedattn::cpu {

void forward(const FwdParams& params);
void backward(const BwdParams& params);
// Appends decode tokens (kv_cache.h); one thread: a decode step writes a few rows.
void append_kv(const AppendParams& params);
// Merges attention over two key sets (merge.h), rows spread over the threads.
void merge_attention(const MergeParams& params);
// Writes 0 to every element of a validated written tensor (check_written), on the calling thread.
void zero_fill(const TensorView& t);

}  // namespace fusedattn::cpu
