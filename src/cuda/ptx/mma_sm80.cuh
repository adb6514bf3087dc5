// Tensor-core matrix multiply-accumulate, mma.sync.m16n8k16 with fp32 accumulators.
//
// Layout contract (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16/.bf16 inputs), with
// lane l, group g = l / 4 and thread-in-group t = l % 4:
//   A (16 x 16, row-major), 4 x b16x2 registers:
//     a[0] = A[g    ][2t, 2t+1]   a[1] = A[g + 8][2t, 2t+1]
//     a[2] = A[g    ][2t+8, 2t+9] a[3] = A[g + 8][2t+8, 2t+9]
//   B (16 x 8, "col": element (k, n) with k fastest), 2 x b16x2 registers:
//     b[0] = B[2t, 2t+1][g]       b[1] = B[2t+8, 2t+9][g]
//   C/D (16 x 8, fp32), 4 registers:
//     d[0] = D[g][2t]  d[1] = D[g][2t+1]  d[2] = D[g+8][2t]  d[3] = D[g+8][2t+1]
//   In every b16x2 register the lower-indexed element is in the low 16 bits.
// Consequence used by the attention kernels: the C fragments of two adjacent n8 tiles of S, packed
// to b16x2, are exactly the A fragment of a 16x16 tile of P for the next mma (P stays in registers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fusedattn::cuda::ptx {

// d += a * b.
// __half:          mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32   (PTX ISA 7.0, sm_80+)
// __nv_bfloat16:   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA 7.0, sm_80+)
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<Element, __half> || std::is_same_v<Element, __nv_bfloat16>,
                "mma_m16n8k16 takes __half or __nv_bfloat16 inputs");
  if constexpr (std::is_same_v<Element, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Two mma.m16n8k16 sharing A, over two adjacent 8-column chunks of D: d[0..3] += a * {b[0], b[1]},
// d[4..7] += a * {b[2], b[3]}, the B registers as one ldmatrix.x4 returns them when its matrices
// are the first chunk's two k halves, then the second's.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16_two_chunks(float (&d)[8], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  const uint32_t first[2] = {b[0], b[1]}, second[2] = {b[2], b[3]};
  mma_m16n8k16<Element>(*reinterpret_cast<float(*)[4]>(&d[0]), a, first);
  mma_m16n8k16<Element>(*reinterpret_cast<float(*)[4]>(&d[4]), a, second);
}

}  // namespace fusedattn::cuda::ptx
