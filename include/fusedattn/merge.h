// Merging attention over disjoint key sets by their log-sum-exp: the step that ring attention
// (context parallelism), split-KV decoding and cascade inference take after attending the same
// queries to each key set on its own. With (out, lse) the attention over keys A and
// (part_out, part_lse) the attention over keys B, the attention over A and B together is
//   lse' = log(exp(lse) + exp(part_lse))
//   out' = exp(lse - lse') * out + exp(part_lse - lse') * part_out
// One pass reads both outputs and writes out' and lse' in place, computed in fp32.
//
// A side whose lse is -inf saw no key: it adds nothing, whatever its output holds (a row with no
// key on either side gets out' = 0 and lse' = -inf). A NaN lse gives a NaN row.
#pragma once

#include "fusedattn/attention.h"

namespace fusedattn {

struct MergeArgs {
  // Read, and written with the merged result: [batch, seqlen, heads, head_dim] with lse
  // [batch, heads, seqlen] (forward()'s dense layout), or [total, heads, head_dim] with lse
  // [heads, total] (its varlen layout). out: fp32, fp16 or bf16 (fp32 keeps a running sum of
  // many parts exact to fp32); lse: fp32. Any strides with the last dimension of out contiguous.
  TensorView out, lse;
  // The other key set's attention, the same shapes; part_out in any of out's dtypes. They may be
  // out and lse themselves (the same views), but must not otherwise share memory with them
  // (checked, as for every written tensor: docs/api.md, "Tensors").
  TensorView part_out, part_lse;
  Backend backend = Backend::kAuto;  // kAuto: the tensors' device decides
  void* stream = nullptr;            // cudaStream_t for the CUDA backend; null = default stream
  int num_threads = 0;               // CPU backend threads; 0 = hardware concurrency
};

// Validates the arguments (throws fusedattn::Error naming the one at fault), then merges.
void merge_attention(const MergeArgs& args);

}  // namespace fusedattn
