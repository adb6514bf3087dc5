// The two warp-level GEMMs of the forward mainloop, on tiles in swizzled shared memory:
//   S = Q K^T   (A = Q via ldmatrix, B = K via ldmatrix: K's rows are the columns of K^T)
//   O += P V    (A = P straight from S's accumulators, B = V via ldmatrix.trans)
// Fragment layouts: src/cuda/ptx/mma_sm80.cuh and ldmatrix.cuh. A warp owns kMTiles m16 tiles of
// query rows; every lane passes one row address per ldmatrix, and because all tile row offsets are
// multiples of 8, a lane's row % 8 is lane % 8 in every tile: the swizzle XOR is a per-lane
// constant folded into one base address per operand pattern (LaneAddress).
#pragma once

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/swizzle.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mma_sm80.cuh"

namespace fusedattn::cuda::sm80 {

// Shared-memory byte addressing of one lane's ldmatrix rows in a swizzled tile: a per-lane base
// register plus offsets. Column pair cp covers chunks 2cp and 2cp+1; the swizzle xors a lane
// constant into chunk bits 0-2, which touches only bits 0-1 of cp within a 128-byte group, so the
// address is the base with (cp % 4) xored into its chunk bits (tiles are 128-byte aligned, so
// those bits of the base are the lane's swizzled chunk alone) plus the group and row offsets.
// One base instead of one per cp % 4 keeps the address registers off the mainloop's budget, and
// stays a register operation (no indexed array) when the k loop is not fully unrolled.
template <typename Element, int kPitch>
struct LaneAddress {
  static constexpr int kChunkBytes = kSwizzleChunkElems * sizeof(Element);
  static constexpr int kRowBytes = kPitch * sizeof(Element);
  static constexpr int kPairBytes = 2 * kChunkBytes;
  static constexpr int kGroupBytes = kSwizzleRows * kChunkBytes;  // 128 bytes
  static constexpr int kPairsPerGroup = kSwizzleRows / 2;          // column pairs within one group
  static_assert(kRowBytes % kGroupBytes == 0, "rows must keep the chunk bits of the base free");
  uint32_t base;

  // lane_row: 0..15 within a 16-row block; lane_chunk: 0 or 1 within a 16-column block.
  __device__ __forceinline__ LaneAddress(uint32_t tile, int lane_row, int lane_chunk) {
    const int lane_xor = lane_chunk ^ (lane_row % kSwizzleRows);
    base = tile + lane_row * kRowBytes + static_cast<uint32_t>(lane_xor * kChunkBytes);
  }

  // Address of (row_offset + lane_row, 16 * col_pair + 8 * lane_chunk) in the tile tile_offset
  // bytes after the one the base was built for (tile_offset and row_offset * kRowBytes are
  // multiples of 128 bytes, so adding them leaves the chunk bits alone).
  __device__ __forceinline__ uint32_t at(uint32_t tile_offset, int row_offset, int col_pair) const {
    return (base ^ static_cast<uint32_t>((col_pair % kPairsPerGroup) * kPairBytes)) + tile_offset +
           (col_pair / kPairsPerGroup) * kGroupBytes + row_offset * kRowBytes;
  }
};

// The two lane patterns of the forward GEMMs. Tiles share a pitch and their offsets are multiples
// of 8 rows, so one set of bases per pattern serves every tile (fewer loop-carried registers).
// The warp's Q rows get a base of their own with the warp's row offset added before the xor:
// added after it, that runtime offset left no immediate form, and ptxas kept one register per
// xor value and 128-byte group (8 for d128 instead of 4).
template <typename Element, int kPitch>
struct FwdLaneAddresses {
  // Q as the A operand and V through ldmatrix.trans: matrices {rows 0-7, 8-15} x {cols 0-7,
  // 8-15} come from lanes 0-7, 8-15, 16-23, 24-31. q is the same pattern on the warp's Q rows.
  LaneAddress<Element, kPitch> v, q;
  // K as the B operand (not transposed): {keys 0-7 x dims 0-7, keys 0-7 x dims 8-15, keys 8-15
  // x dims 0-7, keys 8-15 x dims 8-15}.
  LaneAddress<Element, kPitch> k;
  // warp_row0: the warp's first Q row, a multiple of 8 (so its offset keeps the chunk bits free).
  __device__ __forceinline__ FwdLaneAddresses(uint32_t smem, int lane, int warp_row0)
      : v(smem, lane % 16, lane / 16),
        q(smem + static_cast<uint32_t>(warp_row0 * kPitch * sizeof(Element)), lane % 16, lane / 16),
        k(smem, lane % 8 + lane / 16 * 8, lane / 8 % 2) {}
};

// kUnroll: k16 steps unrolled together. Fewer than all of them bounds how many Q and K fragments
// the scheduler keeps in flight ahead of their MMAs (S's registers are what the rest competes for).
template <typename Element, int kHeadDim, int kUnroll, int kPitch, int kMTiles, int kNTiles>
__device__ __forceinline__ void gemm_qk(float (&s)[kMTiles][kNTiles][4], const FwdLaneAddresses<Element, kPitch>& lanes,
                                        uint32_t k_offset) {
  constexpr int kTileM = 16, kTileN = 8, kKSteps = kHeadDim / 16;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.f;
#pragma unroll kUnroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ptx::ldmatrix_x4(a[mt], lanes.q.at(0, mt * kTileM, ks));
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, lanes.k.at(k_offset, np * 2 * kTileN, ks));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<Element>(s[mt][2 * np], a[mt], b_lo);
        ptx::mma_m16n8k16<Element>(s[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

// P's A fragments for P*V: the C fragments of S tiles 2ks and 2ks+1 (fp32) are, packed to 16 bits,
// exactly the A fragment of the k16 step ks (mma_sm80.cuh), so P never leaves registers. Packing
// before the next tile load halves the registers P holds while that load's addresses are live.
template <typename Element, int kMTiles, int kNTiles>
__device__ __forceinline__ void pack_p(uint32_t (&a)[kMTiles][kNTiles / 2][4], const float (&p)[kMTiles][kNTiles][4]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int ks = 0; ks < kNTiles / 2; ++ks) {
      a[mt][ks][0] = pack2<Element>(p[mt][2 * ks][0], p[mt][2 * ks][1]);
      a[mt][ks][1] = pack2<Element>(p[mt][2 * ks][2], p[mt][2 * ks][3]);
      a[mt][ks][2] = pack2<Element>(p[mt][2 * ks + 1][0], p[mt][2 * ks + 1][1]);
      a[mt][ks][3] = pack2<Element>(p[mt][2 * ks + 1][2], p[mt][2 * ks + 1][3]);
    }
}

template <typename Element, int kPitch, int kMTiles, int kKSteps, int kDTiles>
__device__ __forceinline__ void gemm_pv(float (&o)[kMTiles][kDTiles][4], const uint32_t (&p)[kMTiles][kKSteps][4],
                                        const FwdLaneAddresses<Element, kPitch>& lanes, uint32_t v_offset) {
  constexpr int kTileK = 16;
  // B (V, transposed on load): {keys 0-7, keys 8-15} x {dims 0-7, dims 8-15} from lanes 0-7,
  // 8-15, 16-23, 24-31, giving b[0..1] of one n8 tile of dims and b[2..3] of the next.
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, lanes.v.at(v_offset, ks * kTileK, dp));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ptx::mma_m16n8k16<Element>(o[mt][2 * dp], p[mt][ks], b_lo);
        ptx::mma_m16n8k16<Element>(o[mt][2 * dp + 1], p[mt][ks], b_hi);
      }
    }
}

}  // namespace fusedattn::cuda::sm80
