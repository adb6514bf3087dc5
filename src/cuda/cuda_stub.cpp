// Built instead of the CUDA backend when nvcc is absent: every call names what is missing.
#include "cuda/cuda_backend.h"

#include "fusedattn/error.h"

namespace fusedattn::cuda {
namespace {
[[noreturn]] void unavailable() {
  throw Error(ErrorCode::kBackendUnavailable, "backend",
              "this build of fusedattn has no CUDA backend (nvcc was not found at configure time); "
              "use backend cpu");
}
}  // namespace

bool available() { return false; }
std::string device_name(int) { return "none"; }
bool supports_head_dim(int) { return false; }
std::string supported_head_dims() { return "none (no CUDA backend in this build)"; }
void copy_to_host(void*, const void*, std::size_t, int, void*) { unavailable(); }
void copy_rows_to_host(void*, const void*, std::size_t, std::size_t, std::size_t, int, void*) { unavailable(); }
bool stream_capturing(int, void*) { unavailable(); }
bool take_offsets_fault(int, OffsetsFault&) { unavailable(); }
void forward(const FwdParams&) { unavailable(); }
std::size_t backward_workspace_bytes(const BwdParams&) { unavailable(); }
void backward(const BwdParams&) { unavailable(); }
void append_kv(const AppendParams&) { unavailable(); }
void merge_attention(const MergeParams&) { unavailable(); }
void zero_fill(const TensorView&, void*) { unavailable(); }

}  // namespace fusedattn::cuda
