// Timing of the Hopper forward kernel on the FlashAttention benchmark grid (16k tokens, model
// dim 2048, head dims 64/128/256, seqlen 512..16k, causal and full), plus the ablation switches
// of docs/hopper.md. Disabled by default (it measures, it does not check); run with
//   fusedattn_gpu_tests --gtest_also_run_disabled_tests --gtest_filter='Sm90Bench.*'
// Prints one line per configuration: TFLOP/s = 4 B H Sq Sk d (halved for causal) / time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/dispatch.h"
#include "fusedattn/error.h"
#include "fusedattn/params.h"
#include "gpu/scoped_env.h"

namespace fusedattn::testing {
namespace {

constexpr int64_t kTotalTokens = 16384;
constexpr int kModelDim = 2048;
constexpr int kWarmup = 3;
constexpr int kTimed = 10;
constexpr double kLog2e = 1.4426950408889634;

// Through dispatch, as a caller gets it; null when this build has no Hopper instance.
cuda::FwdFn launcher(const FwdParams& p) {
  try {
    const cuda::FwdChoice choice = cuda::choose_forward(p, 9, 0);
    return std::string(choice.arch) == "sm90" ? choice.fn : nullptr;
  } catch (const Error&) {
    return nullptr;
  }
}

// One set of device buffers for the whole grid (heads * d is always kModelDim, so every
// configuration has the same element count), filled once with random values (never zeros).
struct Buffers {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  bool bf16 = false;
  static constexpr int64_t kElems = kTotalTokens * kModelDim;
  explicit Buffers(bool is_bf16) : bf16(is_bf16) {
    std::vector<uint16_t> host(kElems);
    std::mt19937 rng(is_bf16 ? 2 : 1);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (void** dst : {&q, &k, &v, &o}) {
      for (auto& x : host) {
        const float f = u(rng);
        if (bf16) {
          const __nv_bfloat16 b = __float2bfloat16(f);
          std::memcpy(&x, &b, sizeof(x));
        } else {
          const __half h = __float2half(f);
          std::memcpy(&x, &h, sizeof(x));
        }
      }
      EXPECT_EQ(cudaMalloc(dst, kElems * sizeof(uint16_t)), cudaSuccess);
      cudaMemcpy(*dst, host.data(), kElems * sizeof(uint16_t), cudaMemcpyHostToDevice);
    }
    EXPECT_EQ(cudaMalloc(&lse, kTotalTokens * kModelDim / 64 * sizeof(float)), cudaSuccess);
  }
  ~Buffers() {
    for (void* p : {q, k, v, o, static_cast<void*>(lse)}) cudaFree(p);
  }
};

double time_ms(cuda::FwdFn fn, const FwdParams& p) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < kWarmup; ++i) fn(p);
  cudaEventRecord(a);
  for (int i = 0; i < kTimed; ++i) fn(p);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / kTimed;
}

struct Bench {
  bool bf16;
  int d;
  int64_t seqlen;
  bool causal;
};

double run_one(const Buffers& buf, const Bench& c) {
  const int heads = kModelDim / c.d;
  const int batch = static_cast<int>(kTotalTokens / c.seqlen);
  FwdParams p;
  p.q = buf.q;
  p.k = buf.k;
  p.v = buf.v;
  p.o = buf.o;
  p.lse = buf.lse;
  const OperandStrides s{c.seqlen * heads * c.d, int64_t{heads} * c.d, c.d};
  p.q_stride = p.k_stride = p.v_stride = p.o_stride = s;
  p.lse_batch_stride = int64_t{heads} * c.seqlen;
  p.lse_head_stride = c.seqlen;
  p.dtype = c.bf16 ? DType::kBFloat16 : DType::kFloat16;
  p.batch = batch;
  p.heads_q = p.heads_kv = heads;
  p.head_dim = c.d;
  p.seqlen_q = p.seqlen_k = c.seqlen;
  p.scale = static_cast<float>(1.0 / std::sqrt(double(c.d)));
  p.scale_log2 = static_cast<float>(p.scale * kLog2e);
  p.window_right = c.causal ? 0 : -1;
  p.device = {DeviceType::kCUDA, 0};
  const cuda::FwdFn fn = launcher(p);
  if (fn == nullptr) return NAN;
  const double ms = time_ms(fn, p);
  const double flops = 4.0 * batch * heads * double(c.seqlen) * c.seqlen * c.d * (c.causal ? 0.5 : 1.0);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return flops / (ms * 1e-3) / 1e12;
}

TEST(Sm90Bench, DISABLED_FaGrid) {
  const char* only = std::getenv("SM90_BENCH_DTYPE");  // "fp16" or "bf16" to halve the run
  for (bool bf16 : {false, true}) {
    if (only && std::string(only) != (bf16 ? "bf16" : "fp16")) continue;
    const Buffers buf(bf16);
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (int64_t s : {512, 1024, 2048, 4096, 8192, 16384})
          std::printf("ours %s d%d %s seqlen %5lld : %6.1f TFLOP/s\n", bf16 ? "bf16" : "fp16", d,
                      causal ? "causal" : "full  ", static_cast<long long>(s), run_one(buf, {bf16, d, s, causal}));
  }
}

// What each optimisation buys: the same points with one switch off at a time.
TEST(Sm90Bench, DISABLED_Ablation) {
  const std::vector<std::pair<std::string, std::vector<std::pair<const char*, const char*>>>> variants = {
      {"defaults", {}},
      {"no ping-pong", {{"FUSEDATTN_SM90_PINGPONG", "0"}}},
      {"intra-wg overlap off", {{"FUSEDATTN_SM90_OVERLAP", "0"}}},
      {"intra-wg overlap on", {{"FUSEDATTN_SM90_OVERLAP", "1"}}},
      {"persistent off", {{"FUSEDATTN_SM90_PERSISTENT", "0"}}},
      {"static persistent", {{"FUSEDATTN_SM90_DYNAMIC", "0"}, {"FUSEDATTN_SM90_PERSISTENT", "1"}}},
      {"K released with V", {{"FUSEDATTN_SM90_EARLY_K", "0"}}},
      {"1 stage, no overlap", {{"FUSEDATTN_SM90_OVERLAP", "0"}, {"FUSEDATTN_SM90_STAGES", "1"}}},
      {"none", {{"FUSEDATTN_SM90_OVERLAP", "0"}, {"FUSEDATTN_SM90_STAGES", "1"}, {"FUSEDATTN_SM90_PINGPONG", "0"},
                {"FUSEDATTN_SM90_PERSISTENT", "0"}, {"FUSEDATTN_SM90_EARLY_K", "0"}}},
  };
  const Buffers buf(false);
  for (const auto& [name, env] : variants) {
    const ScopedEnvs scoped(env);
    for (int d : {64, 128, 256})
      for (bool causal : {false, true})
        for (int64_t s : {1024, 8192})
          std::printf("ablation %-20s fp16 d%d %s seqlen %5lld : %6.1f TFLOP/s\n", name.c_str(), d,
                      causal ? "causal" : "full  ", static_cast<long long>(s), run_one(buf, {false, d, s, causal}));
  }
}

}  // namespace
}  // namespace fusedattn::testing
