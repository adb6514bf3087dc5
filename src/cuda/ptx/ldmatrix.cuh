// Warp-collective shared -> register loads of 8x8 b16 matrices (ldmatrix), feeding mma.sync.
//
// Layout contract (PTX ISA, "Warp-level matrix load instruction: ldmatrix"):
//   - .x1/.x2/.x4 load 1/2/4 matrices of 8 rows x 8 b16 elements (16 bytes per row).
//   - Row addresses: lanes 8*m .. 8*m+7 give the 8 row addresses of matrix m (for .x2 only lanes
//     0..15 matter, but every lane must pass a valid address). Each row is 16-byte aligned.
//   - Result: register r[m] of lane l holds matrix m's row (l / 4), elements 2*(l % 4) and
//     2*(l % 4) + 1 (low half = lower column).
//   - .trans: the matrix is transposed on the way, so r[m] of lane l holds column (l / 4), rows
//     2*(l % 4) and 2*(l % 4) + 1 of the matrix as stored. This turns a row-major [k x n] tile
//     (e.g. V stored [key x dim]) into the "col" B operand of mma.m16n8k16.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::ptx {

// ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0,r1,r2,r3}, [smem];   (PTX ISA 6.5, sm_75+)
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {r0,r1,r2,r3}, [smem];   (PTX ISA 6.5, sm_75+)
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// ldmatrix.sync.aligned.m8n8.x2.shared.b16 {r0,r1}, [smem];   (PTX ISA 6.5, sm_75+)
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem));
}

// ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {r0,r1}, [smem];   (PTX ISA 6.5, sm_75+)
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem));
}

}  // namespace fusedattn::cuda::ptx
