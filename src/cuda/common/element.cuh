// Conversions between fp32 registers and packed 16-bit element pairs (the b16x2 operands of
// mma.sync and of 32-bit shared/global stores), for the two element types the kernels support.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusedattn::cuda {

template <typename Element>
constexpr bool kIsSupportedElement = std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>;

// Two floats -> one 32-bit register holding {lo, hi} as Element, round-to-nearest-even; lo sits
// in the low 16 bits, matching the fragment layouts in src/cuda/ptx/mma_sm80.cuh.
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(kIsSupportedElement<Element>, "pack2 takes __half or __nv_bfloat16");
  uint32_t bits;
  if constexpr (std::is_same_v<Element, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    std::memcpy(&bits, &h, sizeof(bits));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&bits, &h, sizeof(bits));
  }
  return bits;
}

// The inverse of pack2: .x is the low half, .y the high half.
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t bits) {
  static_assert(kIsSupportedElement<Element>, "unpack2 takes __half or __nv_bfloat16");
  if constexpr (std::is_same_v<Element, __half>) {
    __half2 h;
    std::memcpy(&h, &bits, sizeof(bits));
    return __half22float2(h);
  } else {
    __nv_bfloat162 h;
    std::memcpy(&h, &bits, sizeof(bits));
    return __bfloat1622float2(h);
  }
}

}  // namespace fusedattn::cuda
