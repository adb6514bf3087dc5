// Block sizes of the sm80 forward kernel, one row per head dim, usable on host and device. The
// launcher sizes shared memory from the same struct the kernel uses, and the static_asserts below
// reject a row that would not tile, not fit in shared memory or not keep its accumulators in
// registers.
#pragma once

#include "cuda/common/swizzle.cuh"

namespace fusedattn::cuda::sm80 {

constexpr int kWarpSize = 32;
constexpr int kMmaM = 16;  // mma.m16n8k16
constexpr int kMmaN = 8;
constexpr int kMmaK = 16;
constexpr int kElementBytes = 2;  // fp16 / bf16
// Opt-in shared memory per block on sm80 (A100: 163 KiB); Hopper allows more, but the portable
// kernel must also run on Ampere.
constexpr int kMaxSmemBytesSm80 = 163 * 1024;
// Accumulator floats one thread may hold (S + O) and still fit in 255 registers with addresses,
// softmax statistics and fragments.
constexpr int kMaxAccumulatorRegs = 200;

struct FwdTile {
  int block_m;  // query rows per thread block
  int block_n;  // key rows per KV block
  int warps;    // each warp owns block_m / warps query rows (split-Q: no cross-warp softmax)
};

// Chosen like FA2 for the same register budget: 128 query rows where the O accumulator still
// fits, otherwise 64; wide KV blocks for small head dims (fewer softmax passes per FLOP).
constexpr FwdTile fwd_tile(int head_dim) {
  switch (head_dim) {
    case 32: return {128, 128, 4};
    case 64: return {128, 128, 4};
    case 96: return {128, 64, 4};
    case 128: return {128, 64, 4};
    case 192: return {64, 64, 4};
    default: return {64, 64, 4};  // 256
  }
}

// Elements per shared-memory row: a power of two of at least 64 elements (the swizzle's unit), so
// the chunk slots of a row divide the thread count (src/cuda/sm80/fwd_tile_io.cuh). d96 and d192
// rows are padded; the padding is never loaded or read.
constexpr int smem_pitch(int head_dim) {
  int pitch = kSwizzlePitchMultiple;
  while (pitch < head_dim) pitch *= 2;
  return pitch;
}

template <int kHeadDim>
struct FwdConfig {
  static constexpr FwdTile kTile = fwd_tile(kHeadDim);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kWarps = kTile.warps;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kMTiles = kWarpRows / kMmaM;    // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / kMmaN;      // n8 tiles of S per warp
  static constexpr int kDTiles = kHeadDim / kMmaN;     // n8 tiles of O per warp
  static constexpr int kPitch = smem_pitch(kHeadDim);  // elements per shared-memory row
  // Shared memory: Q (reused for O in the epilogue), one K and one V tile. K of block n-1 is
  // loaded while P*V of block n runs and V of block n while Q*K^T runs, which hides the loads
  // without a second buffer for either.
  static constexpr int kSmemQ = kBlockM * kPitch * kElementBytes;
  static constexpr int kSmemKV = kBlockN * kPitch * kElementBytes;
  static constexpr int kSmemBytes = kSmemQ + 2 * kSmemKV;
  // Registers allow two blocks per SM (2 x 128 threads x 255 registers fits the 64K file).
  static constexpr int kMinBlocksPerSm = 2;

  static_assert(kHeadDim % kMmaK == 0, "head dim must be a multiple of the mma k (16)");
  static_assert(kBlockM % (kWarps * kMmaM) == 0, "each warp must own whole m16 tiles");
  static_assert(kBlockN % kMmaK == 0, "P*V consumes keys 16 at a time");
  static_assert(kNTiles % 2 == 0 && kDTiles % 2 == 0, "ldmatrix.x4 loads n8 tiles in pairs");
  static_assert(kSmemBytes <= kMaxSmemBytesSm80, "tiles exceed the sm80 shared-memory limit");
  static_assert(kMTiles * (kNTiles + kDTiles) * 4 <= kMaxAccumulatorRegs, "accumulators would spill");
};

}  // namespace fusedattn::cuda::sm80
