// cu_seqlens checked once per tensor contents: a varlen call checks its offsets on the host (a
// device-to-host copy, which syncs the stream), and a model passes the same offsets tensor to
// every attention layer, forward and backward. The binding remembers which tensors it checked,
// keyed by their TensorImpl and torch's version counter (bumped by every in-place write through
// torch), and hands the result to the library (Options::checked_rows_q/k), which then skips the
// check: one sync per offsets tensor and version instead of one or more per call, and varlen
// calls wait for no check once their offsets passed one. Inference tensors
// (torch.inference_mode) have no version counter and are checked on every call. Under a CUDA
// graph capture nothing is read: the library checks the offsets on the device at each replay.
#pragma once

#include <ATen/core/Tensor.h>

#include "fusedattn/attention.h"

namespace fusedattn::torch_binding {

// Fills options.checked_rows_q/k for options.cu_seqlens_q/k (already set, from these tensors),
// checking each through fusedattn::check_cu_seqlens unless this tensor, at its current version,
// data pointer and shape, passed that check for the same max_seqlen and packed rows before. One
// that did not, while the stream is being captured, is left unchecked (-1) rather than read.
void set_checked_rows(Options& options, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                      int64_t packed_rows_q, int64_t packed_rows_k);

// The same for options.cu_seqlens_q alone (a paged call, whose caller vouches for its key
// offsets and table: varlen_fwd's checked_rows_k).
void set_checked_rows_q(Options& options, const at::Tensor& cu_seqlens_q, int64_t packed_rows_q);

}  // namespace fusedattn::torch_binding
