// (arch, dtype, head dim, mask kind) -> the compiled kernel instance that serves a request.
#pragma once

#include <string>

#include "fusedattn/params.h"

namespace fusedattn::cuda {

using FwdFn = void (*)(const FwdParams&);
using BwdFn = void (*)(const BwdParams&);

template <typename Fn>
struct KernelChoice {
  Fn fn = nullptr;
  const char* arch = "";   // "sm80" or "sm90"
  int instance_head_dim = 0;
};
using FwdChoice = KernelChoice<FwdFn>;
using BwdChoice = KernelChoice<BwdFn>;

// Throws kUnsupported naming what no compiled instance covers.
FwdChoice choose_forward(const FwdParams& params, int cc_major, int cc_minor);
BwdChoice choose_backward(const BwdParams& params, int cc_major, int cc_minor);
bool has_head_dim(int head_dim);
std::string compiled_head_dims();

}  // namespace fusedattn::cuda
