// Backward preprocess: everything the main kernel needs per query row, computed once per row
// instead of once per (row, KV block): delta, the base-2 LSE, and zeroed dQ accumulators.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/common/check.cuh"
#include "cuda/common/element.cuh"
#include "cuda/sm80/bwd_aux.h"
#include "cuda/sm80/bwd_rows.cuh"

namespace fusedattn::cuda::sm80 {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

template <typename Element>
__global__ void __launch_bounds__(kRowCtaThreads) bwd_preprocess_kernel(const BwdParams p, const BwdWorkspace ws) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int lane = threadIdx.x % kRowThreads;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / kRowThreads;
  const SeqInfo seq = seq_info(p, b);
  const bool valid = i < seq.len_q;
  const int64_t row = ws.row_base(p, b, h) + i;

  float delta = 0.f;
  if (valid) {
    const auto* dout = static_cast<const Element*>(p.dout) + element_offset(p.do_stride, b, seq.q_start + i, h);
    const auto* out = static_cast<const Element*>(p.o) + element_offset(p.o_stride, b, seq.q_start + i, h);
    for (int c = lane; c < p.head_dim / kChunkElems; c += kRowThreads) {
      const uint4 d4 = *reinterpret_cast<const uint4*>(dout + c * kChunkElems);
      const uint4 o4 = *reinterpret_cast<const uint4*>(out + c * kChunkElems);
      const uint32_t dw[4] = {d4.x, d4.y, d4.z, d4.w}, ow[4] = {o4.x, o4.y, o4.z, o4.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 d2 = unpack2<Element>(dw[k]), o2 = unpack2<Element>(ow[k]);
        delta = fmaf(d2.x, o2.x, fmaf(d2.y, o2.y, delta));
      }
    }
  }
  // The kRowThreads lanes of a row are consecutive lanes of one warp.
#pragma unroll
  for (int offset = kRowThreads / 2; offset > 0; offset /= 2) delta += __shfl_xor_sync(0xffffffffu, delta, offset);

  if (lane == 0) {
    ws.delta[row] = -delta;
    // lse = -inf marks a fully masked row: store +inf so exp2(s - lse2) = 0 without a guard in
    // the main loop (exp2(s + inf) would be inf and poison every dK/dV it touches).
    float lse2 = INFINITY;
    if (valid) {
      const float lse = p.lse[static_cast<int64_t>(b) * p.lse_batch_stride + static_cast<int64_t>(h) * p.lse_head_stride +
                              seq.q_start + i];
      lse2 = lse == -INFINITY ? INFINITY : lse * kLog2e;
    }
    ws.lse2[row] = lse2;
  }
  auto* acc = reinterpret_cast<float4*>(ws.dq_acc + row * ws.dq_pitch);
  for (int64_t c = lane; c < ws.dq_pitch / 4; c += kRowThreads) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (ws.dq_sem != nullptr && i % kBwdSemRows == 0 && lane == 0) ws.dq_sem[row / kBwdSemRows] = 0;
}

}  // namespace

template <typename Element>
void launch_bwd_preprocess(const BwdParams& p, const BwdWorkspace& ws, cudaStream_t stream) {
  bwd_preprocess_kernel<Element><<<row_grid(p, ws), kRowCtaThreads, 0, stream>>>(p, ws);
  FUSEDATTN_CHECK_LAUNCH();
}

template void launch_bwd_preprocess<__half>(const BwdParams&, const BwdWorkspace&, cudaStream_t);
template void launch_bwd_preprocess<__nv_bfloat16>(const BwdParams&, const BwdWorkspace&, cudaStream_t);

}  // namespace fusedattn::cuda::sm80
