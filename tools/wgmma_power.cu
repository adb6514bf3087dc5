// What a wgmma's shared-memory operand reads cost at the power cap: the same m64n128k16 fp16 MMAs
// with A from shared memory (wgmma SS, as the forward's Q K^T reads Q) and with A from registers
// (wgmma RS, as its P V reads P), on random data, one CTA of two warpgroups per SM, back to back for
// a few seconds each while nvidia-smi samples the SM clock and the board power. Prints TFLOP/s, MHz,
// W, FLOP per SM-cycle and joules per PFLOP per variant (docs/hopper.md, session 72). A third
// variant adds, under each group of MMAs, the ALU work of the forward's softmax for one 64-key
// d256 block (the same FLOPs as the group): per thread 32 FFMA, 32 MUFU.EX2, 32 FADD, 32 FMNMX,
// 16 conversions to half pairs and 4 shuffles, so its joules per FLOP say what that work costs.
//
//   nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude tools/wgmma_power.cu
//        -o build-gpu/wgmma_power && build-gpu/wgmma_power [seconds per run, default 2] [uniform|normal]
//
// B is the same 128 x 128 tile in both (N-major, as V); SS adds A's 2 KiB per instruction (64 x 16),
// a third more operand bytes. A diagnostic, not part of the library or its tests.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/mufu.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace ptx = fusedattn::cuda::ptx;

namespace {

constexpr int kWarpgroups = 2;           // as the forward's consumers
constexpr int kThreads = kWarpgroups * 128;
constexpr int kN = 128;                  // MMA width: the instruction both variants issue
constexpr int kSteps = 8;                // k-steps of 16 per pass: a 64 x 128 A tile, a 128 x 128 B tile
constexpr int kGroupSteps = 2 * kSteps;  // MMAs per commit group (two passes)
constexpr int kABytes = 64 * 16 * kSteps * 2;   // 16 KiB: A, K-major, two 64-column slabs
constexpr int kBBytes = kN * 16 * kSteps * 2;   // 32 KiB: B, N-major, two 64-column groups
constexpr int kSlabBytes = 64 * 128;            // one 64-column, 64-row slab of 128-byte rows
constexpr int kAStepBytes = 16 * 2;             // a k-step inside a K-major slab: 16 elements
constexpr int kBStepBytes = 16 * 128;           // a k-step of the N-major B: 16 rows of 128 bytes
constexpr uint32_t kAtom = ptx::kSwizzleAtomBytes;  // 8-row groups of either operand
constexpr double kFlopPerMma = 2.0 * 64 * kN * 16;

enum class Variant { kSharedA, kRegisterA, kRegisterASoftmax };
constexpr int kScores = 32;  // a thread's scores of one 64-key block (two rows x 16)
constexpr float kScaleLog2 = 0.0883883f;  // 1/sqrt(128): any scale; the mix is what is measured

__device__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}
// Operand values: uniform in [-1, 1), or close to N(0, 1) (a sum of four uniforms, scaled), as
// torch.randn's inputs to the attention benchmarks; every mantissa bit toggles either way.
__constant__ int g_normal_data;
__device__ float uniform(uint32_t i, uint32_t seed) {
  return static_cast<float>(mix(i * 2654435761U + seed) >> 8) * (2.f / 16777216.f) - 1.f;
}
__device__ __half random_half(uint32_t i, uint32_t seed) {
  if (!g_normal_data) return __float2half(uniform(i, seed));
  const float sum = uniform(4 * i, seed) + uniform(4 * i + 1, seed) + uniform(4 * i + 2, seed) + uniform(4 * i + 3, seed);
  return __float2half(sum * 0.8660254f);  // four uniforms on [-1, 1) have variance 4/3
}

template <Variant kVariant>
__global__ void __launch_bounds__(kThreads) mma_loop(float* out, int groups, uint32_t seed) {
  extern __shared__ __align__(1024) unsigned char smem[];
  auto* h = reinterpret_cast<__half*>(smem);
  for (int i = threadIdx.x; i < (kABytes + kBBytes) / 2; i += kThreads) h[i] = random_half(i, seed);
  ptx::fence_proxy_async_shared();  // the generic stores, then the async proxy's MMA reads
  __syncthreads();

  const uint32_t a_base = ptx::smem_addr(smem), b_base = a_base + kABytes;
  // A K-major: 8-row groups 1024 bytes apart (SBO); a k-step moves 32 bytes inside a slab.
  // B N-major: 64-column groups kBBytes / 2 apart (LBO), 8-row k groups 1024 apart (SBO); a
  // k-step is 16 rows, 2048 bytes.
  uint32_t a_regs[4];
  for (int r = 0; r < 4; ++r) {
    const __half2 pair = __halves2half2(random_half(threadIdx.x * 8 + 2 * r, seed ^ 0x55U),
                                        random_half(threadIdx.x * 8 + 2 * r + 1, seed ^ 0x55U));
    a_regs[r] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  float d[kN / 2] = {};
  float scores[kScores];
  for (int j = 0; j < kScores; ++j) scores[j] = __half2float(random_half(threadIdx.x * kScores + j, seed ^ 0xAAU));
  float row_max = 0.f, row_sum = 0.f;
  uint32_t packed = 0;
  for (int g = 0; g < groups; ++g) {
    ptx::wgmma_fence();
#pragma unroll
    for (int s = 0; s < kGroupSteps; ++s) {
      const int k = s % kSteps;
      const uint64_t desc_b = ptx::make_smem_desc(b_base + k * kBStepBytes, kBBytes / 2, kAtom);
      if constexpr (kVariant == Variant::kSharedA) {
        constexpr int kStepsPerSlab = 4;  // 64 columns
        const uint64_t desc_a = ptx::make_smem_desc(
            a_base + (k / kStepsPerSlab) * kSlabBytes + (k % kStepsPerSlab) * kAStepBytes, 16, kAtom);
        ptx::wgmma_ss_bmn<__half, kN>(d, desc_a, desc_b, true);
      } else {  // kRegisterA, kRegisterASoftmax
        ptx::wgmma_rs<__half, kN>(d, a_regs, desc_b, true);
      }
    }
    ptx::wgmma_commit_group();
    if constexpr (kVariant == Variant::kRegisterASoftmax) {
      // The softmax's instruction mix, in flight under the group's MMAs as in the overlapped loop.
      float block_max = row_max;
#pragma unroll
      for (int j = 0; j < kScores; ++j) block_max = fmaxf(block_max, scores[j]);
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffU, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffU, block_max, 2));
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kScores; j += 2) {
        const float p0 = ptx::ex2_approx(fmaf(scores[j], kScaleLog2, -block_max));
        const float p1 = ptx::ex2_approx(fmaf(scores[j + 1], kScaleLog2, -block_max));
        sum += p0 + p1;
        const __half2 pair = __floats2half2_rn(p0, p1);
        packed ^= *reinterpret_cast<const uint32_t*>(&pair);
        scores[j] = p1 - 0.5f;  // next block's scores: new values, so nothing is hoisted
        scores[j + 1] = p0 - 0.5f;
      }
      sum += __shfl_xor_sync(0xffffffffU, sum, 1);
      sum += __shfl_xor_sync(0xffffffffU, sum, 2);
      row_sum = row_sum * 0.5f + sum;
      row_max = block_max * 0.5f;
    }
    ptx::wgmma_wait_group<0>();
  }
  float* row = out + (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) * (kN / 2);
  for (int i = 0; i < kN / 2; ++i) row[i] = d[i];
  if constexpr (kVariant == Variant::kRegisterASoftmax) row[0] += row_sum + row_max + static_cast<float>(packed & 1U);
}

// nvidia-smi's SM clock and board power, sampled every 50 ms in the background.
struct Sampler {
  struct Sample {
    double t, mhz, watts;
  };
  std::vector<Sample> samples;
  std::mutex lock;
  FILE* pipe = nullptr;
  std::thread reader;
  std::chrono::steady_clock::time_point zero = std::chrono::steady_clock::now();

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - zero).count(); }
  Sampler() {
    pipe = popen("nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms=50 -i 0", "r");
    if (pipe == nullptr) return;
    reader = std::thread([this] {
      char line[256];
      while (fgets(line, sizeof line, pipe) != nullptr) {
        double mhz = 0, watts = 0;
        if (sscanf(line, "%lf, %lf", &mhz, &watts) == 2) {
          std::lock_guard<std::mutex> guard(lock);
          samples.push_back({now(), mhz, watts});
        }
      }
    });
  }
  void mean(double t0, double t1, double& mhz, double& watts) {
    std::lock_guard<std::mutex> guard(lock);
    int n = 0;
    mhz = watts = 0;
    for (const Sample& s : samples)
      if (s.t >= t0 && s.t <= t1) mhz += s.mhz, watts += s.watts, ++n;
    if (n > 0) mhz /= n, watts /= n;
  }
  ~Sampler() {
    if (pipe == nullptr) return;
    [[maybe_unused]] const int killed = std::system("pkill -f 'nvidia-smi --query-gpu=clocks.sm,power.draw' > /dev/null 2>&1");
    reader.join();
    pclose(pipe);
  }
};

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

template <Variant kVariant>
void run(const char* name, double seconds, int sms, float* out, Sampler& sampler) {
  const int smem = kABytes + kBBytes;
  check(cudaFuncSetAttribute(mma_loop<kVariant>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  const int groups = 4096;  // a launch of ~10 ms
  const auto launch = [&](uint32_t seed) { mma_loop<kVariant><<<sms, kThreads, smem>>>(out, groups, seed); };
  const double warm_end = sampler.now() + 0.5;
  uint32_t seed = 1;
  while (sampler.now() < warm_end) launch(seed++);
  check(cudaDeviceSynchronize(), "warm-up");
  const double t0 = sampler.now();
  long launches = 0;
  while (sampler.now() - t0 < seconds) {
    for (int i = 0; i < 4; ++i) launch(seed++);
    launches += 4;
    check(cudaDeviceSynchronize(), "run");
  }
  const double t1 = sampler.now();
  double mhz = 0, watts = 0;
  sampler.mean(t0, t1, mhz, watts);
  const double flop = kFlopPerMma * kGroupSteps * groups * kWarpgroups * sms * launches;
  const double tflops = flop / (t1 - t0) / 1e12;
  std::printf("%-12s %8.1f TFLOP/s %6.0f MHz %6.0f W %8.0f FLOP/SM-cycle %8.1f J/PFLOP\n", name, tflops, mhz,
              watts, tflops * 1e12 / (mhz * 1e6 * sms), watts / tflops * 1e3);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const std::string data = argc > 2 ? argv[2] : "uniform";
  if (data != "uniform" && data != "normal") {
    std::fprintf(stderr, "data: expected uniform or normal, got %s\n", data.c_str());
    return 2;
  }
  const int normal = data == "normal";
  check(cudaMemcpyToSymbol(g_normal_data, &normal, sizeof normal), "data");
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device");
  float* out = nullptr;
  check(cudaMalloc(&out, static_cast<size_t>(sms) * kThreads * (kN / 2) * sizeof(float)), "malloc");
  Sampler sampler;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::printf("m64n128k16 fp16, two warpgroups per SM on %d SMs, %s random operands, %.1f s per run\n", sms,
              data.c_str(), seconds);
  for (int round = 0; round < 2; ++round) {  // A B C C B A, so a drift in temperature falls on all
    if (round == 0) {
      run<Variant::kSharedA>("A in smem", seconds, sms, out, sampler);
      run<Variant::kRegisterA>("A in regs", seconds, sms, out, sampler);
      run<Variant::kRegisterASoftmax>("+ softmax", seconds, sms, out, sampler);
    } else {
      run<Variant::kRegisterASoftmax>("+ softmax", seconds, sms, out, sampler);
      run<Variant::kRegisterA>("A in regs", seconds, sms, out, sampler);
      run<Variant::kSharedA>("A in smem", seconds, sms, out, sampler);
    }
  }
  check(cudaFree(out), "free");
  return 0;
}
