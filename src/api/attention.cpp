// Entry points: validate, pick the backend, run. Backends never see unvalidated arguments.
#include "fusedattn/attention.h"
#include "fusedattn/kv_cache.h"
#include "fusedattn/merge.h"

#include <thread>

#include "api/validate.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"

namespace fusedattn {

void forward(const ForwardArgs& args) {
  FwdParams params;
  Backend backend;
  if (!detail::make_fwd_params(args, params, backend)) return;
  if (backend == Backend::kCUDA)
    cuda::forward(params);
  else
    cpu::forward(params);
}

void backward(const BackwardArgs& args) {
  BwdParams params;
  Backend backend;
  if (!detail::make_bwd_params(args, params, backend)) {
    // No query rows: no query attends to a key, so the key gradients are 0 (dq has no elements).
    for (const TensorView* grad : {&args.dk, &args.dv}) {
      if (backend == Backend::kCUDA)
        cuda::zero_fill(*grad, args.options.stream);
      else
        cpu::zero_fill(*grad);
    }
    return;
  }
  if (backend == Backend::kCUDA)
    cuda::backward(params);
  else
    cpu::backward(params);
}

void append_kv(const AppendKvArgs& args) {
  AppendParams params;
  Backend backend;
  if (!detail::make_append_params(args, params, backend)) return;
  if (backend == Backend::kCUDA)
    cuda::append_kv(params);
  else
    cpu::append_kv(params);
}

void merge_attention(const MergeArgs& args) {
  MergeParams params;
  Backend backend;
  if (!detail::make_merge_params(args, params, backend)) return;
  if (backend == Backend::kCUDA)
    cuda::merge_attention(params);
  else
    cpu::merge_attention(params);
}

int64_t check_cu_seqlens(const TensorView& cu_seqlens, bool keys, int64_t max_seqlen, int64_t packed_rows,
                         void* stream) {
  return detail::check_offsets(cu_seqlens, keys, max_seqlen, packed_rows, stream);
}

void check_device_errors(const Device& device) {
  if (device.type != DeviceType::kCUDA) return;
  OffsetsFault fault;
  if (cuda::take_offsets_fault(device.index, fault)) throw detail::fault_error(fault);
}

bool stream_capturing(const Device& device, void* stream) {
  return device.type == DeviceType::kCUDA && cuda::stream_capturing(device.index, stream);
}

std::size_t backward_workspace_bytes(const BackwardArgs& args) {
  BwdParams params;
  Backend backend;
  if (!detail::make_bwd_params(args, params, backend)) return 0;
  return backend == Backend::kCUDA ? cuda::backward_workspace_bytes(params) : 0;
}

bool cuda_available() { return cuda::available(); }

std::string device_name(Backend backend) {
  if (backend == Backend::kCUDA) return cuda::device_name(0);
  return "CPU (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
}

}  // namespace fusedattn
