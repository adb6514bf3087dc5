// Tensor-memory-accelerator (TMA) bulk tensor copies between global and shared memory, over
// CCCL's <cuda/ptx> wrappers. Tensor maps (CUtensorMap) are built on the host (see
// src/cuda/sm90/tensor_map.h) and passed as __grid_constant__ kernel parameters.
//
// Contract: coordinates are element indices, innermost first (here {dim, row, head, batch}).
// Loads fill out-of-bounds box elements with zeros and still deliver the whole box's bytes to the
// mbarrier; stores drop out-of-bounds elements. The shared tile must be laid out as the map's
// swizzle mode says (128-byte swizzle: see the layout contract in wgmma.cuh).
#pragma once

#include <cuda.h>

#include <cuda/ptx>

#include <cstdint>

namespace fusedattn::cuda::ptx {

// cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//   [dst], [map, {c0, c1, c2, c3}], [bar]; PTX ISA 8.0, sm_90.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            int32_t c3, uint64_t* bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, map, coords, bar);
}

// The same for a 5-D tensor, coordinates {c0 .. c4}; PTX ISA 8.0, sm_90.
__device__ __forceinline__ void tma_load_5d(void* smem_dst, const CUtensorMap* map, int32_t c0, int32_t c1, int32_t c2,
                                            int32_t c3, int32_t c4, uint64_t* bar) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, map, coords, bar);
}

// cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster
//   [dst], [map, {c0, c1, c2, c3}], [bar], cta_mask; PTX ISA 8.0, sm_90a. The box lands at dst's
// offset in the shared memory of every CTA of the cluster in cta_mask (bit r: rank r), and each
// one's mbarrier at bar's offset counts its bytes.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem_dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                                      int32_t c2, int32_t c3, uint64_t* bar, uint16_t cta_mask) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, map, coords, bar,
                                    cta_mask);
}
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar];
// PTX ISA 8.0, sm_90. A plain copy of `bytes` (a multiple of 16; both addresses 16-byte aligned)
// that counts its bytes on bar.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* src, uint32_t bytes, uint64_t* bar) {
  ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, smem_dst, src, bytes, bar);
}

// cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [map, {c0, c1, c2, c3}], [src];
// PTX ISA 8.0, sm_90.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_src, int32_t c0, int32_t c1,
                                             int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_global, ::cuda::ptx::space_shared, map, coords, smem_src);
}

// The same for a 5-D tensor; PTX ISA 8.0, sm_90.
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* map, const void* smem_src, int32_t c0, int32_t c1,
                                             int32_t c2, int32_t c3, int32_t c4) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_global, ::cuda::ptx::space_shared, map, coords, smem_src);
}

// cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [map, {c0, c1, c2, c3}],
// [src]; PTX ISA 8.0, sm_90. Adds the box at the coordinates to global memory, element-wise
// atomically, from a shared tile laid out as the map's swizzle says; elements outside the tensor
// are dropped. Completes in the bulk group of the stores above (tma_store_commit,
// tma_store_wait_read).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t smem_src, int32_t c0, int32_t c1,
                                                  int32_t c2, int32_t c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// cp.async.bulk.commit_group; PTX ISA 8.0, sm_90. Closes the group of stores issued so far.
__device__ __forceinline__ void tma_store_commit() { ::cuda::ptx::cp_async_bulk_commit_group(); }

// cp.async.bulk.wait_group.read 0; PTX ISA 8.0, sm_90. The shared sources of all committed
// stores have been read (the buffer may be reused); the global writes may still be in flight.
__device__ __forceinline__ void tma_store_wait_read() { ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>{}); }

// cp.async.bulk.wait_group 0; PTX ISA 8.0, sm_90. All committed stores are complete.
__device__ __forceinline__ void tma_store_wait_all() { ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{}); }

// prefetch.tensormap [map]; PTX ISA 8.0, sm_90. Pulls the descriptor into the cache early.
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace fusedattn::cuda::ptx
