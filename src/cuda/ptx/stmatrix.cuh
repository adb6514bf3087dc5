// Warp-collective register -> shared stores of 8x8 b16 matrices (stmatrix), the inverse of
// ldmatrix (ptx/ldmatrix.cuh) with the same layout contract (PTX ISA, "Warp-level matrix store
// instruction: stmatrix"):
//   - .x4 stores 4 matrices of 8 rows x 8 b16 elements (16 bytes per row, 16-byte aligned).
//   - Row addresses: lanes 8*m .. 8*m+7 give the 8 row addresses of matrix m.
//   - Source: register r[m] of lane l holds matrix m's row (l / 4), elements 2*(l % 4) and
//     2*(l % 4) + 1 (low half = lower column): the fp32 accumulator layout of mma and wgmma,
//     packed to pairs.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::ptx {

// stmatrix.sync.aligned.m8n8.x4.shared.b16 [smem], {r0,r1,r2,r3};   (PTX ISA 7.8, sm_90+)
__device__ __forceinline__ void stmatrix_x4(uint32_t smem, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

}  // namespace fusedattn::cuda::ptx
