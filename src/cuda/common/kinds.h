// Compile-time axes of the CUDA kernels, usable from host code. Only what changes registers or
// shared memory is a template parameter: element type, head dim, mask kind, architecture.
#pragma once

namespace fusedattn::cuda {

// kFull: no mask except the sequence-length boundary. kWindow: causal and sliding windows (causal
// is window_right = 0), bottom-right aligned; the kernel skips KV blocks outside the window and
// masks element-wise only on the blocks the window's edges cut. kColumn: a column-sparse mask
// (FwdParams::column_mask) on top of an optional window, in the portable kernels and the Hopper
// forward (d64/d128, sm90/column_mask.cuh); the key blocks it hides are skipped from a per-block
// summary of its bounds (common/column_mask.cuh).
enum class MaskKind { kFull, kWindow, kColumn };

}  // namespace fusedattn::cuda
