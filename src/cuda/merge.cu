// merge_attention on the CUDA backend (merge.h). One pass over both outputs: a row (batch,
// seqlen, head) per group of a warp's lanes, each lane merging vectors of kVector elements where
// the rows' starts and length allow it, single elements otherwise. Every lane of a group computes
// the row's weights from its two LSEs (merge_weights, params.h: the CPU backend's rule); the
// group's first lane writes the merged LSE once the whole warp has read the old ones.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/device.h"
#include "cuda/common/element.cuh"
#include "cuda/cuda_backend.h"
#include "fusedattn/error.h"

namespace fusedattn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
// Elements per load where they allow it: 16 bytes of fp32, 8 of fp16/bf16.
constexpr int kVector = 4;

// kN elements of a storage type at p, as floats, and back.
template <typename T, int kN>
struct Elements {
  static_assert(kN == 1, "vectors of kVector only");
  __device__ static void load(const T* p, float (&v)[kN]) {
    if constexpr (std::is_same_v<T, float>)
      v[0] = *p;
    else if constexpr (std::is_same_v<T, __half>)
      v[0] = __half2float(*p);
    else
      v[0] = __bfloat162float(*p);
  }
  __device__ static void store(T* p, const float (&v)[kN]) {
    if constexpr (std::is_same_v<T, float>)
      *p = v[0];
    else if constexpr (std::is_same_v<T, __half>)
      *p = __float2half_rn(v[0]);
    else
      *p = __float2bfloat16_rn(v[0]);
  }
};
template <typename T>
struct Elements<T, kVector> {
  __device__ static void load(const T* p, float (&v)[kVector]) {
    if constexpr (std::is_same_v<T, float>) {
      const float4 x = *reinterpret_cast<const float4*>(p);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(p);
      const float2 lo = unpack2<T>(x.x), hi = unpack2<T>(x.y);
      v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
    }
  }
  __device__ static void store(T* p, const float (&v)[kVector]) {
    if constexpr (std::is_same_v<T, float>)
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    else
      *reinterpret_cast<uint2*>(p) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
  }
};

// lanes: a row's group of lanes, a power of two up to a warp, so that a group never spans warps.
template <typename Out, typename Part, int kN>
__global__ void __launch_bounds__(kThreads) merge_kernel(const __grid_constant__ MergeParams p, int lanes) {
  const int64_t rows = p.batch * p.seqlen * p.heads;
  const int64_t r = int64_t{blockIdx.x} * (kThreads / lanes) + threadIdx.x / lanes;
  const int lane = threadIdx.x % lanes;
  const bool live = r < rows;
  const int64_t h = r % p.heads, s = r / p.heads % p.seqlen, b = r / p.heads / p.seqlen;
  const auto at = [&](const OperandStrides& st) { return b * st.batch + s * st.row + h * st.head; };
  MergeWeights w{};
  if (live) w = merge_weights(p.lse[at(p.lse_stride)], p.part_lse[at(p.part_lse_stride)]);
  __syncwarp();  // the row's old LSE is read by every lane of its group before the first lane writes
  if (!live) return;
  Out* out = static_cast<Out*>(p.out) + at(p.out_stride);
  const Part* part = static_cast<const Part*>(p.part_out) + at(p.part_stride);
  for (int64_t d = int64_t{lane} * kN; d < p.head_dim; d += int64_t{lanes} * kN) {
    float o[kN], q[kN];
    Elements<Out, kN>::load(out + d, o);
    Elements<Part, kN>::load(part + d, q);
    for (int i = 0; i < kN; ++i) o[i] = merge_element(w, o[i], q[i]);
    Elements<Out, kN>::store(out + d, o);
  }
  if (lane == 0) p.lse[at(p.lse_stride)] = w.lse;
}

// Whether both outputs' rows start on kVector-element boundaries and hold whole vectors.
bool rows_take_vectors(const MergeParams& p) {
  const auto aligned = [](const void* data, const OperandStrides& st, std::size_t element) {
    const auto bytes = reinterpret_cast<std::uintptr_t>(data);
    return bytes % (kVector * element) == 0 && st.batch % kVector == 0 && st.row % kVector == 0 &&
           st.head % kVector == 0;
  };
  return p.head_dim % kVector == 0 && aligned(p.out, p.out_stride, dtype_size(p.out_dtype)) &&
         aligned(p.part_out, p.part_stride, dtype_size(p.part_dtype));
}

template <typename Out, typename Part>
void launch(const MergeParams& p) {
  const int vector = rows_take_vectors(p) ? kVector : 1;
  const int64_t steps = (p.head_dim + vector - 1) / vector;
  int lanes = 1;
  while (lanes < kWarpSize && lanes < steps) lanes *= 2;
  const int64_t rows = p.batch * p.seqlen * p.heads, rows_per_block = kThreads / lanes;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > INT_MAX)
    throw Error(ErrorCode::kUnsupported, "out",
                std::to_string(rows) + " rows are more than the CUDA backend's merge launches (" +
                    std::to_string(int64_t{INT_MAX} * rows_per_block) + ")");
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (vector == kVector)
    merge_kernel<Out, Part, kVector><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, lanes);
  else
    merge_kernel<Out, Part, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, lanes);
  FUSEDATTN_CHECK_LAUNCH();
}

template <typename Out>
void launch_from(const MergeParams& p) {
  switch (p.part_dtype) {
    case DType::kFloat16: return launch<Out, __half>(p);
    case DType::kBFloat16: return launch<Out, __nv_bfloat16>(p);
    default: return launch<Out, float>(p);
  }
}

}  // namespace

void merge_attention(const MergeParams& p) {
  DeviceGuard guard(p.device_index);
  switch (p.out_dtype) {
    case DType::kFloat16: return launch_from<__half>(p);
    case DType::kBFloat16: return launch_from<__nv_bfloat16>(p);
    default: return launch_from<float>(p);
  }
}

}  // namespace fusedattn::cuda
