// Compile-time axes of the CUDA kernels, usable from host code. Only what changes registers or
// shared memory is a template parameter: element type, head dim, mask kind, architecture.
#pragma once

namespace fusedattn::cuda {

// kFull: no mask except the sequence-length boundary. kWindow: causal and sliding windows (causal
// is window_right = 0), bottom-right aligned; the kernel skips KV blocks outside the window and
// masks element-wise only on the blocks the window's edges cut.
enum class MaskKind { kFull, kWindow };

}  // namespace fusedattn::cuda
