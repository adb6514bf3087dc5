// Typed errors. Every entry point validates its arguments before touching memory and throws
// fusedattn::Error whose message names the offending argument and what is accepted.
#pragma once

#include <stdexcept>
#include <string>

namespace fusedattn {

enum class ErrorCode {
  kInvalidArgument,  // a value outside what the API accepts (negative size, bad window, ...)
  kDtypeMismatch,    // tensors that must share a dtype do not, or a dtype is not accepted
  kShapeMismatch,    // shapes that must agree do not
  kUnsupported,      // valid in principle but not implemented (head dim, fp8, backend, ...)
  kLayout,           // last-dimension stride != 1, misaligned pointer or stride
  kDeviceMismatch,   // tensors on different devices, or on a device the backend cannot use
  kBackendUnavailable,  // e.g. --backend cuda in a build without CUDA or on a machine without a GPU
  kRuntime,          // a CUDA or system call failed
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string argument, const std::string& message)
      : std::runtime_error(argument.empty() ? message : argument + ": " + message),
        code_(code),
        argument_(std::move(argument)) {}
  ErrorCode code() const { return code_; }
  // The name of the argument at fault, as spelled in the API ("q", "cu_seqlens_k", "window_left").
  const std::string& argument() const { return argument_; }

 private:
  ErrorCode code_;
  std::string argument_;
};

}  // namespace fusedattn
