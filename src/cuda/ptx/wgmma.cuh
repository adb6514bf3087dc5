// Warpgroup matrix multiply (wgmma.mma_async), sm_90a only: the asynchronous tensor-core MMA that a
// warpgroup (4 consecutive warps starting at a warp index divisible by 4) issues collectively.
// CUDA 13.0's <cuda/ptx> has no wrapper for it, so these are thin inline-PTX wrappers.
//
// Layout contract (PTX ISA 8.0, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
//  * Accumulator D of m64nNk16 with .f32: N/2 floats per thread. Warp w of the warpgroup owns rows
//    16w..16w+15; in lane l, with r = 16w + l/4 and c = 2*(l%4), element d[4j + e] is
//      e = 0: (r,     8j + c)   e = 1: (r,     8j + c + 1)
//      e = 2: (r + 8, 8j + c)   e = 3: (r + 8, 8j + c + 1)          for j = 0 .. N/8 - 1.
//    So each thread holds two rows (r and r + 8), and the four lanes of a quad share a row.
//  * A from registers (16-bit types): four b32 registers, each two elements, for the warp's 16
//    rows x 16 k:  a0 = (r, c..c+1)  a1 = (r+8, c..c+1)  a2 = (r, 8+c..9+c)  a3 = (r+8, 8+c..9+c).
//    This is the accumulator layout of two neighbouring 8-column chunks, which is why a softmax
//    result P can be fed back as the A operand without any data movement between threads.
//  * A and B from shared memory are described by a 64-bit matrix descriptor (make_smem_desc).
//    All tiles here use the 128-byte swizzle: rows of 64 16-bit elements (128 bytes), grouped in
//    8-row atoms of 1024 bytes whose 16-byte chunks are permuted by chunk ^= row % 8, exactly the
//    layout the TMA engine writes with CU_TENSOR_MAP_SWIZZLE_128B.
//      K-major (trans 0): SBO = byte distance between 8-row groups along M/N; LBO unused (1).
//      MN-major (trans 1): LBO = byte distance between 64-element groups along M/N,
//                          SBO = byte distance between 8-row groups along K.
//    Atoms must start on a 1024-byte boundary (base offset 0); moving the start address by 32
//    bytes inside an atom selects the next 16 k-columns of a K-major tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/int_math.h"

namespace fusedattn::cuda::ptx {

// ---- shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") ----------------------
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 49-51 base offset (0: atoms 1024-byte aligned), 62-63 swizzle mode (1 = 128-byte swizzle).
constexpr uint32_t kDescFieldMask = 0x3FFFF;  // descriptor fields hold address bits 4..17
constexpr int kDescLboShift = 16;
constexpr int kDescSboShift = 32;
constexpr int kDescSwizzleShift = 62;
constexpr uint64_t kDescSwizzle128B = 1;
constexpr uint32_t kSwizzleAtomBytes = 1024;  // 8 rows x 128 bytes
constexpr uint32_t kSwizzleRowBytes = 128;

constexpr __host__ __device__ uint64_t desc_encode(uint32_t bytes) { return (bytes & kDescFieldMask) >> 4; }

// The descriptor as two 32-bit words. The high word (stride byte offset, swizzle) is fixed by the
// operand's layout, a compile-time constant; only the low word (start address, leading byte
// offset) depends on where the tile sits. So a k-step's descriptor is the tile's low word plus
// the encoded step offset -- one 32-bit add, no carry into the high word (tiles stay below
// 256 KiB: the address field never overflows) -- and the high word never needs a register.
// Outside a cluster the start address is not masked to the field: a CTA's .shared window address
// on sm_90 is below its 228 KiB, inside the field's 18 bits already, and the mask (which ptxas
// cannot prove redundant) would cost an instruction each time a K or V stage's word is formed,
// twice per KV block. The fields do not overlap, so adding them is or-ing them, and ptxas fuses
// the shift with the add. In a cluster launch (kInCluster) the address is masked: there the
// window addresses of a CTA of rank 1 have bits above the field set, which unmasked spill into
// the leading byte offset (H200: that CTA's wgmmas read wrong operands from correct tiles,
// docs/hopper.md, session 35).
constexpr int kDescWordBits = 32;
constexpr uint32_t kSharedWindowBytes = 228 * 1024;
static_assert(kSharedWindowBytes - 1 <= kDescFieldMask, "shared addresses fit the descriptor's address field");
template <bool kInCluster = false>
constexpr __host__ __device__ uint32_t desc_low_word(uint32_t smem_address, uint32_t leading_byte_offset) {
  const uint32_t address = kInCluster ? smem_address & kDescFieldMask : smem_address;
  return (address >> 4) + static_cast<uint32_t>(desc_encode(leading_byte_offset) << kDescLboShift);
}
constexpr __host__ __device__ uint32_t desc_high_word(uint32_t stride_byte_offset) {
  return static_cast<uint32_t>(desc_encode(stride_byte_offset) << (kDescSboShift - kDescWordBits) |
                               kDescSwizzle128B << (kDescSwizzleShift - kDescWordBits));
}
constexpr __host__ __device__ uint64_t desc_from_words(uint32_t low, uint32_t high) {
  return uint64_t{high} << kDescWordBits | low;
}

constexpr __host__ __device__ uint64_t make_smem_desc(uint32_t smem_address, uint32_t leading_byte_offset,
                                                      uint32_t stride_byte_offset) {
  return desc_from_words(desc_low_word(smem_address, leading_byte_offset), desc_high_word(stride_byte_offset));
}

// ---- ordering --------------------------------------------------------------------------------
// wgmma.fence.sync.aligned; sm_90a. Required before the first wgmma of a batch whenever its
// accumulator or A registers were last written by ordinary instructions (softmax, rescale).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// wgmma.commit_group.sync.aligned; sm_90a. Closes the batch of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// wgmma.wait_group.sync.aligned N; sm_90a. Waits until at most N committed batches are pending.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  static_assert(kPending >= 0 && kPending <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// An empty asm that claims to read and write r: stops the compiler from moving accesses to an
// accumulator across the asynchronous window between a wgmma issue and its wait.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <typename T, int kN>
__device__ __forceinline__ void fence_operands(T (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) fence_operand(r[i]);
}

// mov.b32 (volatile); any SM. Returns x unchanged, but as a value ptxas must produce here: what is
// derived from it (the per-k-step descriptors of a tile) is computed where it is used instead of
// being hoisted out of the loop and kept live (16 registers at d128, 32 at d256, where the
// hoisted copies spilled).
__device__ __forceinline__ uint32_t value_here(uint32_t x) {
  uint32_t y;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// A scheduling anchor: complete_before_wait(never, smem_address, values...) makes the computation
// of every value (the softmax row sums, which depend on every probability of the block; the next
// block's P, converted while P V still runs) finish before the next wgmma.wait_group. ptxas treats
// the wait as free to hoist and fills latency gaps (a shuffle's) with it, so without an anchor the
// softmax meant to overlap the in-flight P V GEMM ends up waiting for it. The anchor stores the
// values to shared memory behind a branch on a condition that never holds at run time but that
// ptxas cannot fold (callers pass e.g. `batch == 0`): ptxas keeps the stores, and so the values,
// ahead of the wait. One branch for all of them rather than a predicated store each: a
// predicated-off store still takes an issue slot every step, the branch one. Each store gets its
// own address, or ptxas drops all but the last as overwritten and the rest are no longer pinned.
constexpr uint32_t kAnchorStoreBytes = 16;  // st.shared.v4.b32, the widest shared store

__device__ __forceinline__ void anchor_store(const float (&x)[2], uint32_t smem_address) {
  asm volatile("st.shared.v2.f32 [%2], {%0, %1};\n" ::"f"(x[0]), "f"(x[1]), "r"(smem_address));
}
template <int kN>
__device__ __forceinline__ void anchor_store(const uint32_t (&x)[kN], uint32_t smem_address) {
  static_assert(kN % 4 == 0, "stored four registers at a time");
#pragma unroll
  for (int i = 0; i < kN; i += 4)
    asm volatile("st.shared.v4.b32 [%4], {%0, %1, %2, %3};\n" ::"r"(x[i]), "r"(x[i + 1]), "r"(x[i + 2]),
                 "r"(x[i + 3]), "r"(smem_address + i / 4 * kAnchorStoreBytes));
}
template <class T, int kN>
constexpr uint32_t anchor_bytes(const T (&)[kN]) {
  return round_up(kN * sizeof(T), kAnchorStoreBytes);
}

template <class... Arrays>
__device__ __forceinline__ void complete_before_wait(bool never, uint32_t smem_address, const Arrays&... values) {
  if (__builtin_expect(never, false)) {
    uint32_t offset = 0;
    ((anchor_store(values, smem_address + offset), offset += anchor_bytes(values)), ...);
  }
}

// ---- the MMAs --------------------------------------------------------------------------------
// The accumulator operand lists spelled out ("%0, %1, ...") for 16, 20, 28, 32, 40, 48, 56, 64, 96
// and 128 registers.
#define FUSEDATTN_WGMMA_ACC_16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FUSEDATTN_WGMMA_ACC_20 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19"
#define FUSEDATTN_WGMMA_ACC_28 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27"
#define FUSEDATTN_WGMMA_ACC_32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FUSEDATTN_WGMMA_ACC_40 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39"
#define FUSEDATTN_WGMMA_ACC_48 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define FUSEDATTN_WGMMA_ACC_56 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55"
#define FUSEDATTN_WGMMA_ACC_64 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FUSEDATTN_WGMMA_ACC_96 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FUSEDATTN_WGMMA_ACC_128 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

#define FUSEDATTN_ACC_OPS_8(d, i)                                                                    \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FUSEDATTN_ACC_OPS_16(d, i) FUSEDATTN_ACC_OPS_8(d, i), FUSEDATTN_ACC_OPS_8(d, i + 8)
#define FUSEDATTN_ACC_OPS_20(d, i) \
  FUSEDATTN_ACC_OPS_8(d, i), FUSEDATTN_ACC_OPS_8(d, i + 8), "+f"(d[i + 16]), "+f"(d[i + 17]), "+f"(d[i + 18]), "+f"(d[i + 19])
#define FUSEDATTN_ACC_OPS_28(d, i) \
  FUSEDATTN_ACC_OPS_8(d, i), FUSEDATTN_ACC_OPS_16(d, i + 8), "+f"(d[i + 24]), "+f"(d[i + 25]), "+f"(d[i + 26]), "+f"(d[i + 27])
#define FUSEDATTN_ACC_OPS_32(d, i) \
  FUSEDATTN_ACC_OPS_8(d, i), FUSEDATTN_ACC_OPS_8(d, i + 8), FUSEDATTN_ACC_OPS_8(d, i + 16), FUSEDATTN_ACC_OPS_8(d, i + 24)
#define FUSEDATTN_ACC_OPS_40(d, i) FUSEDATTN_ACC_OPS_32(d, i), FUSEDATTN_ACC_OPS_8(d, i + 32)
#define FUSEDATTN_ACC_OPS_48(d, i) FUSEDATTN_ACC_OPS_32(d, i), FUSEDATTN_ACC_OPS_16(d, i + 32)
#define FUSEDATTN_ACC_OPS_56(d, i) FUSEDATTN_ACC_OPS_28(d, i), FUSEDATTN_ACC_OPS_28(d, i + 28)
#define FUSEDATTN_ACC_OPS_64(d, i) FUSEDATTN_ACC_OPS_32(d, i), FUSEDATTN_ACC_OPS_32(d, i + 32)
#define FUSEDATTN_ACC_OPS_96(d, i) FUSEDATTN_ACC_OPS_64(d, i), FUSEDATTN_ACC_OPS_32(d, i + 64)
#define FUSEDATTN_ACC_OPS_128(d, i) FUSEDATTN_ACC_OPS_64(d, i), FUSEDATTN_ACC_OPS_64(d, i + 64)

// wgmma.mma_async.sync.aligned.m64n<N>k16.f32.<T>.<T> {d}, descA, descB, p, 1, 1, TA, TB; sm_90a.
// A (64x16) and B (16xN) in shared memory, each K-major (0) or MN-major (1, imm-trans); p =
// scale-d (0: D = A*B, 1: D += A*B).
#define FUSEDATTN_WGMMA_SS_TRANS(N, NACC, TY, IA, IB, IP, TA, TB)                                     \
  asm volatile(                                                                                       \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                               \
      "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" FUSEDATTN_WGMMA_ACC_##NACC "}, " \
      "%" #IA ", %" #IB ", p, 1, 1, " #TA ", " #TB ";\n}\n"                                           \
      : FUSEDATTN_ACC_OPS_##NACC(d, 0)                                                                \
      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)))
// Both operands K-major.
#define FUSEDATTN_WGMMA_SS(N, NACC, TY, IA, IB, IP) FUSEDATTN_WGMMA_SS_TRANS(N, NACC, TY, IA, IB, IP, 0, 0)

// wgmma.mma_async.sync.aligned.m64n<N>k16.f32.<T>.<T> {d}, {a0..a3}, descB, p, 1, 1, 1; sm_90a.
// A (64x16) from registers, B (16xN) in shared memory N-major (imm-trans-b = 1), as V is stored.
#define FUSEDATTN_WGMMA_RS(N, NACC, TY, IA, IB, IP)                                                     \
  asm volatile(                                                                                         \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" FUSEDATTN_WGMMA_ACC_##NACC "}, " \
      "{%" #IA ", %" FUSEDATTN_NEXT_##IA ", %" FUSEDATTN_NEXT2_##IA ", %" FUSEDATTN_NEXT3_##IA "}, "    \
      "%" #IB ", p, 1, 1, 1;\n}\n"                                                                      \
      : FUSEDATTN_ACC_OPS_##NACC(d, 0)                                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)))
// Operand numbers of a1..a3 that follow a0 (= the accumulator count).
#define FUSEDATTN_NEXT_32 "33"
#define FUSEDATTN_NEXT2_32 "34"
#define FUSEDATTN_NEXT3_32 "35"
#define FUSEDATTN_NEXT_48 "49"
#define FUSEDATTN_NEXT2_48 "50"
#define FUSEDATTN_NEXT3_48 "51"
#define FUSEDATTN_NEXT_64 "65"
#define FUSEDATTN_NEXT2_64 "66"
#define FUSEDATTN_NEXT3_64 "67"
#define FUSEDATTN_NEXT_96 "97"
#define FUSEDATTN_NEXT2_96 "98"
#define FUSEDATTN_NEXT3_96 "99"
#define FUSEDATTN_NEXT_128 "129"
#define FUSEDATTN_NEXT2_128 "130"
#define FUSEDATTN_NEXT3_128 "131"

template <typename Element>
constexpr bool kIsHalf = std::is_same_v<Element, __half>;

// D (64 x kN fp32) = or += A (64 x 16, smem, K-major) * B (16 x kN, smem, K-major). N = 128, 112,
// 80 and 64 are the KV blocks of sm90/tile_config.h, 64, 56, 40 and 32 their first halves (a causal
// diagonal block of which a slice sees only the first half, sm90/mask.cuh).
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 32 || kN == 40 || kN == 56 || kN == 64 || kN == 80 || kN == 112 || kN == 128,
                "instantiated for N = 32, 40, 56, 64, 80, 112, 128");
  if constexpr (kN == 32) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(32, 16, "f16", 16, 17, 18);
    else FUSEDATTN_WGMMA_SS(32, 16, "bf16", 16, 17, 18);
  } else if constexpr (kN == 40) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(40, 20, "f16", 20, 21, 22);
    else FUSEDATTN_WGMMA_SS(40, 20, "bf16", 20, 21, 22);
  } else if constexpr (kN == 56) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(56, 28, "f16", 28, 29, 30);
    else FUSEDATTN_WGMMA_SS(56, 28, "bf16", 28, 29, 30);
  } else if constexpr (kN == 64) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(64, 32, "f16", 32, 33, 34);
    else FUSEDATTN_WGMMA_SS(64, 32, "bf16", 32, 33, 34);
  } else if constexpr (kN == 80) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(80, 40, "f16", 40, 41, 42);
    else FUSEDATTN_WGMMA_SS(80, 40, "bf16", 40, 41, 42);
  } else if constexpr (kN == 112) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(112, 56, "f16", 56, 57, 58);
    else FUSEDATTN_WGMMA_SS(112, 56, "bf16", 56, 57, 58);
  } else {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS(128, 64, "f16", 64, 65, 66);
    else FUSEDATTN_WGMMA_SS(128, 64, "bf16", 64, 65, 66);
  }
}

// D (64 x kN fp32) = or += A (64 x 16, registers) * B (16 x kN, smem, N-major). N = the head dim;
// N = 96 reads the first half of B's second 64-column group.
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                         bool accumulate) {
  static_assert(kN == 64 || kN == 96 || kN == 128 || kN == 192 || kN == 256,
                "instantiated for N = 64, 96, 128, 192, 256");
  if constexpr (kN == 64) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_RS(64, 32, "f16", 32, 36, 37);
    else FUSEDATTN_WGMMA_RS(64, 32, "bf16", 32, 36, 37);
  } else if constexpr (kN == 96) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_RS(96, 48, "f16", 48, 52, 53);
    else FUSEDATTN_WGMMA_RS(96, 48, "bf16", 48, 52, 53);
  } else if constexpr (kN == 128) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_RS(128, 64, "f16", 64, 68, 69);
    else FUSEDATTN_WGMMA_RS(128, 64, "bf16", 64, 68, 69);
  } else if constexpr (kN == 192) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_RS(192, 96, "f16", 96, 100, 101);
    else FUSEDATTN_WGMMA_RS(192, 96, "bf16", 96, 100, 101);
  } else {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_RS(256, 128, "f16", 128, 132, 133);
    else FUSEDATTN_WGMMA_RS(256, 128, "bf16", 128, 132, 133);
  }
}

// D (64 x 64 fp32) = or += A (64 x 16, smem, M-major) * B (16 x 64, smem, N-major): the backward's
// dQ = dS K, whose dS is stored transposed ([key][query], sm90/bwd_kernel.cuh) and whose K is
// [key][d], so both operands run along the reduction's rows.
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_ss_mn(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 64, "instantiated for N = 64");
  if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS_TRANS(64, 32, "f16", 32, 33, 34, 1, 1);
  else FUSEDATTN_WGMMA_SS_TRANS(64, 32, "bf16", 32, 33, 34, 1, 1);
}

// D (64 x kN fp32) = or += A (64 x 16, smem, K-major) * B (16 x kN, smem, N-major): the
// backward's dK += dS^T Q at d64 (N = 64) and dV += P^T dO and dK += dS^T Q at d256 (N = 128),
// whose dS^T (and P^T) pass through shared memory.
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_ss_bmn(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(kN == 64 || kN == 128, "instantiated for N = 64 and 128");
  if constexpr (kN == 64) {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS_TRANS(64, 32, "f16", 32, 33, 34, 0, 1);
    else FUSEDATTN_WGMMA_SS_TRANS(64, 32, "bf16", 32, 33, 34, 0, 1);
  } else {
    if constexpr (kIsHalf<Element>) FUSEDATTN_WGMMA_SS_TRANS(128, 64, "f16", 64, 65, 66, 0, 1);
    else FUSEDATTN_WGMMA_SS_TRANS(128, 64, "bf16", 64, 65, 66, 0, 1);
  }
}

}  // namespace fusedattn::cuda::ptx
