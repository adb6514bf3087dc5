// Argument validation: turns ForwardArgs/BackwardArgs into the params block a backend consumes,
// or throws fusedattn::Error naming the argument at fault. Nothing here touches tensor data
// except cu_seqlens, which is read (copied to the host for a CUDA call) to check monotonicity.
#pragma once

#include "cuda/offsets_fault.h"
#include "fusedattn/attention.h"
#include "fusedattn/error.h"
#include "fusedattn/kv_cache.h"
#include "fusedattn/merge.h"
#include "fusedattn/params.h"

namespace fusedattn::detail {

// The backend that will run a call whose tensors live on `device`.
Backend choose_backend(Backend requested, const Device& device);

// Returns false when the call is a valid no-op (zero batch, zero heads or zero query rows).
bool make_fwd_params(const ForwardArgs& args, FwdParams& params, Backend& backend);
bool make_bwd_params(const BackwardArgs& args, BwdParams& params, Backend& backend);
// Returns false when there is nothing to write (no sequence or no new token).
bool make_append_params(const AppendKvArgs& args, AppendParams& params, Backend& backend);
// Returns false when there is no row to merge.
bool make_merge_params(const MergeArgs& args, MergeParams& params, Backend& backend);

// A fault of offsets or a paged table, found on the host or on the device, as the error naming
// the argument at fault.
Error fault_error(const OffsetsFault& fault);

// fusedattn::check_cu_seqlens (attention.h).
int64_t check_offsets(const TensorView& cu_seqlens, bool keys, int64_t max_seqlen, int64_t packed_rows, void* stream);

constexpr int kMaxHeadDim = 256;
// The portable CUDA kernels put heads and batch on the grid's y and z dimensions, whose hardware
// limit is 65535.
constexpr int64_t kCudaMaxGridYZ = 65535;

}  // namespace fusedattn::detail
