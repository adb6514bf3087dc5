#include "cuda/sm90/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <limits>
#include <string>

#include "cuda/sm90/dq_rows.h"
#include "fusedattn/error.h"

namespace fusedattn::cuda::sm90 {
namespace {

constexpr int kDriverApiVersion = 12000;  // cuTensorMapEncodeTiled's signature since CUDA 12.0

// Resolved through the runtime so the library needs no -lcuda at link time.
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* sym = nullptr;
    cudaDriverEntryPointQueryResult status{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &sym, kDriverApiVersion, cudaEnableDefault, &status);
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || sym == nullptr)
      throw Error(ErrorCode::kRuntime, "", "cannot resolve cuTensorMapEncodeTiled from the CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(sym);
  }();
  return fn;
}

CUtensorMapDataType map_dtype(DType d) {
  if (d == DType::kBFloat16) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (d == DType::kFloat32) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;  // the backward's dQ workspace
  return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// A tiled map of `rank` dims (innermost first) with 128-byte swizzle; a dimension of extent 1 is
// never stepped through, and validation leaves its stride unconstrained, so it gets any 16-byte
// multiple.
template <int kRank>
CUtensorMap encode(DType dtype, const void* base, const cuuint64_t (&dims)[kRank], const int64_t (&strides)[kRank - 1],
                   const cuuint32_t (&box)[kRank], L2Promotion promotion = L2Promotion::k256B) {
  const uint64_t elem = dtype_size(dtype);
  cuuint64_t byte_strides[kRank - 1];
  constexpr cuuint64_t kAnyAlignedStride = 16;
  for (int d = 0; d < kRank - 1; ++d)
    byte_strides[d] = dims[d + 1] <= 1 ? kAnyAlignedStride : static_cast<cuuint64_t>(strides[d]) * elem;
  cuuint32_t element_strides[kRank];
  for (int d = 0; d < kRank; ++d) element_strides[d] = 1;
  const CUtensorMapL2promotion l2_promotion =
      promotion == L2Promotion::k128B ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  CUtensorMap map;
  const CUresult res = encode_fn()(&map, map_dtype(dtype), kRank, const_cast<void*>(base), dims, byte_strides, box,
                                   element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS)
    throw Error(ErrorCode::kRuntime, "", "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(res));
  return map;
}

}  // namespace

CUtensorMap make_tensor_map(const OperandView& view, int box_cols, int box_rows, L2Promotion promotion) {
  const cuuint64_t dims[] = {static_cast<cuuint64_t>(view.head_dim), static_cast<cuuint64_t>(view.rows),
                             static_cast<cuuint64_t>(view.heads), static_cast<cuuint64_t>(view.batch)};
  const int64_t strides[] = {view.strides.row, view.strides.head, view.strides.batch};
  const cuuint32_t box[] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1, 1};
  return encode<4>(view.dtype, view.base, dims, strides, box, promotion);
}

CUtensorMap make_grouped_tensor_map(const OperandView& view, int group, int box_cols, int box_rows) {
  const cuuint64_t dims[] = {static_cast<cuuint64_t>(view.head_dim), static_cast<cuuint64_t>(group),
                             static_cast<cuuint64_t>(view.rows), static_cast<cuuint64_t>(view.heads / group),
                             static_cast<cuuint64_t>(view.batch)};
  const int64_t strides[] = {view.strides.head, view.strides.row, view.strides.head * group, view.strides.batch};
  const cuuint32_t box[] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(group),
                            static_cast<cuuint32_t>(box_rows / group), 1, 1};
  return encode<5>(view.dtype, view.base, dims, strides, box);
}

CUtensorMap make_slab_tensor_map(const OperandView& view, int slabs, int slab_cols, int box_rows) {
  if (view.head_dim != int64_t{slabs} * slab_cols)
    throw Error(ErrorCode::kRuntime, "", "a slab tensor map needs head_dim = slabs x slab columns");
  const cuuint64_t dims[] = {static_cast<cuuint64_t>(slab_cols), static_cast<cuuint64_t>(view.rows),
                             static_cast<cuuint64_t>(slabs), static_cast<cuuint64_t>(view.heads),
                             static_cast<cuuint64_t>(view.batch)};
  const int64_t strides[] = {view.strides.row, slab_cols, view.strides.head, view.strides.batch};
  const cuuint32_t box[] = {static_cast<cuuint32_t>(slab_cols), static_cast<cuuint32_t>(box_rows),
                            static_cast<cuuint32_t>(slabs), 1, 1};
  return encode<5>(view.dtype, view.base, dims, strides, box);
}

CUtensorMap make_dq_tensor_map(const float* base, int64_t cols, int64_t rows, int64_t pitch, int box_cols, int box_rows) {
  if (rows % kDqRowGroup != 0 || box_rows % kDqRowGroup != 0)
    throw Error(ErrorCode::kRuntime, "", "the dQ tensor map needs rows and box rows in multiples of 8");
  if (rows > std::numeric_limits<int32_t>::max())
    throw Error(ErrorCode::kRuntime, "", "the dQ workspace's rows pass the TMA's 32-bit coordinates");
  const DqMapShape shape = dq_interleaved_map_shape(cols, rows, pitch, box_cols, box_rows);
  cuuint64_t dims[4];
  cuuint32_t box[4];
  for (int d = 0; d < 4; ++d) {
    dims[d] = static_cast<cuuint64_t>(shape.dims[d]);
    box[d] = static_cast<cuuint32_t>(shape.box[d]);
  }
  return encode<4>(DType::kFloat32, base, dims, shape.strides, box);
}

}  // namespace fusedattn::cuda::sm90
