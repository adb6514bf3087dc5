// Backward epilogue for dQ: the main kernel accumulates dS K in fp32 (across KV blocks, through
// atomics or the deterministic ordered adds); this scales by the softmax scale once and rounds
// to the element type, writing only valid rows and columns of dq.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/check.cuh"
#include "cuda/common/element.cuh"
#include "cuda/sm80/bwd_aux.h"
#include "cuda/sm80/bwd_rows.cuh"

namespace fusedattn::cuda::sm80 {
namespace {

template <typename Element>
__global__ void __launch_bounds__(kRowCtaThreads) bwd_convert_dq_kernel(const BwdParams p, const BwdWorkspace ws) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int lane = threadIdx.x % kRowThreads;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kRowThreads;
  const SeqInfo seq = seq_info(p, b);
  if (i >= seq.len_q) return;
  const float* acc = ws.dq_acc + (ws.row_base(p, b, h) + i) * ws.dq_pitch;
  auto* dq = static_cast<Element*>(p.dq) + element_offset(p.dq_stride, b, seq.q_start + i, h);
  for (int c = lane; c < p.head_dim / kChunkElems; c += kRowThreads) {
    const float4 lo = *reinterpret_cast<const float4*>(acc + c * kChunkElems);
    const float4 hi = *reinterpret_cast<const float4*>(acc + c * kChunkElems + 4);
    const float s = p.scale;
    const uint4 packed = {pack2<Element>(lo.x * s, lo.y * s), pack2<Element>(lo.z * s, lo.w * s),
                          pack2<Element>(hi.x * s, hi.y * s), pack2<Element>(hi.z * s, hi.w * s)};
    *reinterpret_cast<uint4*>(dq + c * kChunkElems) = packed;
  }
}

}  // namespace

template <typename Element>
void launch_bwd_convert_dq(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream) {
  bwd_convert_dq_kernel<Element><<<row_grid(p, ws), kRowCtaThreads, 0, stream>>>(p, ws);
  FUSEDATTN_CHECK_LAUNCH();
}

template void launch_bwd_convert_dq<__half>(const BwdParams&, const BwdWorkspace&, cudaStream_t);
template void launch_bwd_convert_dq<__nv_bfloat16>(const BwdParams&, const BwdWorkspace&, cudaStream_t);

}  // namespace fusedattn::cuda::sm80
