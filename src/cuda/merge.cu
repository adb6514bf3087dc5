// merge_attention on the CUDA backend (merge.h). One pass over both outputs: a row (batch,
// seqlen, head) per group of a warp's lanes, each lane merging vectors of 8 or 4 elements where
// the rows' starts and length allow it, single elements otherwise. Every lane of a group computes
// the row's weights from its two LSEs (merge_weights, params.h: the CPU backend's rule); the
// group's first lane writes the merged LSE once the whole warp has read the old ones.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
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
constexpr int kLoadBytes = 16;  // the widest load
// Elements a lane merges per step where the rows allow it: 16-byte loads of fp16/bf16 (8) or
// 16-byte loads of fp32 (4); single elements otherwise.
constexpr int kVectors[] = {8, 4};
constexpr int kFloatsPerLoad = kLoadBytes / sizeof(float);

// kN elements of a storage type at p as floats, and back: loads of up to 16 bytes.
template <typename T, int kN>
struct Elements {
  __device__ static void load(const T* p, float (&v)[kN]) {
    if constexpr (kN == 1) {
      v[0] = to_float(*p);
    } else if constexpr (std::is_same_v<T, float>) {
      for (int c = 0; c < kN; c += kFloatsPerLoad) {
        const float4 x = reinterpret_cast<const float4*>(p)[c / kFloatsPerLoad];
        v[c] = x.x, v[c + 1] = x.y, v[c + 2] = x.z, v[c + 3] = x.w;
      }
    } else if constexpr (kN == 8) {
      const uint4 x = *reinterpret_cast<const uint4*>(p);
      unpack(x.x, v, 0), unpack(x.y, v, 2), unpack(x.z, v, 4), unpack(x.w, v, 6);
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(p);
      unpack(x.x, v, 0), unpack(x.y, v, 2);
    }
  }
  __device__ static void store(T* p, const float (&v)[kN]) {
    if constexpr (kN == 1) {
      *p = from_float(v[0]);
    } else if constexpr (std::is_same_v<T, float>) {
      for (int c = 0; c < kN; c += kFloatsPerLoad)
        reinterpret_cast<float4*>(p)[c / kFloatsPerLoad] = make_float4(v[c], v[c + 1], v[c + 2], v[c + 3]);
    } else if constexpr (kN == 8) {
      *reinterpret_cast<uint4*>(p) =
          make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
    }
  }

 private:
  __device__ static float to_float(T x) {
    if constexpr (std::is_same_v<T, float>)
      return x;
    else if constexpr (std::is_same_v<T, __half>)
      return __half2float(x);
    else
      return __bfloat162float(x);
  }
  __device__ static T from_float(float x) {
    if constexpr (std::is_same_v<T, float>)
      return x;
    else if constexpr (std::is_same_v<T, __half>)
      return __float2half_rn(x);
    else
      return __float2bfloat16_rn(x);
  }
  __device__ static void unpack(uint32_t bits, float (&v)[kN], int at) {
    const float2 f = unpack2<T>(bits);
    v[at] = f.x, v[at + 1] = f.y;
  }
};

// Row r's (batch, seqlen, head) indices: in 32 bits where the rows allow (a 64-bit division is a
// long instruction sequence, as costly here as the row's loads).
struct RowIndex {
  int64_t b, s, h;
};
__device__ RowIndex row_index(const MergeParams& p, int64_t r, bool rows_fit_32_bits) {
  if (rows_fit_32_bits) {
    const auto x = static_cast<uint32_t>(r), heads = static_cast<uint32_t>(p.heads),
               seqlen = static_cast<uint32_t>(p.seqlen);
    return {x / heads / seqlen, x / heads % seqlen, x % heads};
  }
  return {r / p.heads / p.seqlen, r / p.heads % p.seqlen, r % p.heads};
}

// lanes: a row's group of lanes, a power of two up to a warp, so that a group never spans warps.
template <typename Out, typename Part, int kN>
__global__ void __launch_bounds__(kThreads) merge_kernel(const __grid_constant__ MergeParams p, int lanes) {
  const int64_t rows = p.batch * p.seqlen * p.heads;
  const int64_t r = int64_t{blockIdx.x} * (kThreads / lanes) + threadIdx.x / lanes;
  const int lane = threadIdx.x % lanes;
  const bool live = r < rows;
  const RowIndex i = row_index(p, live ? r : 0, rows <= UINT32_MAX);
  const auto at = [&](const OperandStrides& st) { return element_offset(st, i.b, i.s, i.h); };
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
    for (int e = 0; e < kN; ++e) o[e] = merge_element(w, o[e], q[e]);
    Elements<Out, kN>::store(out + d, o);
  }
  if (lane == 0) p.lse[at(p.lse_stride)] = w.lse;
}

// Whether a tensor's rows start where loads of kN elements (16 bytes at most) may read them.
bool rows_aligned(const void* data, const OperandStrides& st, std::size_t element, int n) {
  const std::size_t bytes = std::min<std::size_t>(n * element, kLoadBytes);
  const auto aligned = [&](int64_t stride) { return stride * element % bytes == 0; };
  return reinterpret_cast<std::uintptr_t>(data) % bytes == 0 && aligned(st.batch) && aligned(st.row) &&
         aligned(st.head);
}

// The widest vector both outputs' rows take, or 1.
int vector_width(const MergeParams& p) {
  for (int n : kVectors)
    if (p.head_dim % n == 0 && rows_aligned(p.out, p.out_stride, dtype_size(p.out_dtype), n) &&
        rows_aligned(p.part_out, p.part_stride, dtype_size(p.part_dtype), n))
      return n;
  return 1;
}

template <typename Out, typename Part, int kN>
void launch_with(const MergeParams& p) {
  const int64_t steps = (p.head_dim + kN - 1) / kN;
  int lanes = 1;
  while (lanes < kWarpSize && lanes < steps) lanes *= 2;
  const int64_t rows = p.batch * p.seqlen * p.heads, rows_per_block = kThreads / lanes;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > INT_MAX)
    throw Error(ErrorCode::kUnsupported, "out",
                std::to_string(rows) + " rows are more than the CUDA backend's merge launches (" +
                    std::to_string(int64_t{INT_MAX} * rows_per_block) + ")");
  merge_kernel<Out, Part, kN>
      <<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p, lanes);
  FUSEDATTN_CHECK_LAUNCH();
}

template <typename Out, typename Part>
void launch(const MergeParams& p) {
  switch (vector_width(p)) {
    case 8: return launch_with<Out, Part, 8>(p);
    case 4: return launch_with<Out, Part, 4>(p);
    default: return launch_with<Out, Part, 1>(p);
  }
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
