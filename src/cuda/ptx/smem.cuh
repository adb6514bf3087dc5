// Shared-memory addressing for the PTX wrappers.
//
// Layout contract: every wrapper in src/cuda/ptx/ that touches shared memory takes a 32-bit address
// in the shared state space (the .shared window), not a generic pointer. Converting once per tile
// and adding byte offsets keeps address arithmetic in 32-bit registers inside hot loops.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::ptx {

// cvta.to.shared.u64 (via __cvta_generic_to_shared); any SM. The shared window is < 4 GiB, so the
// address fits in 32 bits, which is what ldmatrix/cp.async expect for a .shared operand.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace fusedattn::cuda::ptx
