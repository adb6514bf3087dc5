// The CUDA backend as seen from the host-side API layer. Compiled from src/cuda/*.cu when nvcc is
// present, otherwise from src/cuda/cuda_stub.cpp, whose functions report kBackendUnavailable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/offsets_fault.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda {

// True when the build has CUDA kernels and the runtime sees at least one device.
bool available();
std::string device_name(int device_index);
// Head dims the kernels of this build accept (any multiple of 8 up to the largest instance).
bool supports_head_dim(int head_dim);
std::string supported_head_dims();
// Copies `bytes` from device to host on `stream` and waits (used to validate cu_seqlens).
void copy_to_host(void* dst, const void* src, std::size_t bytes, int device_index, void* stream);
// Copies the first row_bytes of `rows` rows src_pitch bytes apart to dst, packed, on `stream`, and
// waits (used to validate a block table's entries in use).
void copy_rows_to_host(void* dst, const void* src, std::size_t row_bytes, std::size_t rows, std::size_t src_pitch,
                       int device_index, void* stream);

// Whether `stream` of the device is being captured into a CUDA graph (no host read may wait on it).
bool stream_capturing(int device_index, void* stream);
// Waits for the device, then returns (and forgets) the first fault the device check of offsets
// recorded there since the last call (offsets_check.h); false when there was none.
bool take_offsets_fault(int device_index, OffsetsFault& fault);

void forward(const FwdParams& params);
std::size_t backward_workspace_bytes(const BwdParams& params);
void backward(const BwdParams& params);
void append_kv(const AppendParams& params);
void merge_attention(const MergeParams& params);
// Writes 0 to every element of a validated written tensor (check_written) on `stream`, by 2-D
// memsets (api/zero_runs.h), without waiting.
void zero_fill(const TensorView& t, void* stream);

}  // namespace fusedattn::cuda
