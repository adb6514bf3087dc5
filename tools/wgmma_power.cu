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
//        [mma|forward]
//
// B is the same 128 x 128 tile in both (N-major, as V); SS adds A's 2 KiB per instruction (64 x 16),
// a third more operand bytes. A diagnostic, not part of the library or its tests.
//
// The forward-shaped variants (session 73) issue what the d256 64-key kernel issues per block and
// warpgroup: S = Q K^T as 16 m64n64k16 SS MMAs (Q and K K-major, 32 KiB each), then O += P V as 4
// m64n256k16 RS MMAs (V N-major, 32 KiB), the same FLOPs as a group above, with the softmax mix on
// S; and optionally each block's K and V brought from the L2 by bulk copies (a producer warp, a ring
// of two stages on full/empty barriers, as the kernel's), whole (an unpaired CTA's 64 KiB per
// block) or half (a CTA of a pair: 32 KiB per block, the other half left in place).
//   build-gpu/wgmma_power 3 uniform forward
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
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/mufu.cuh"
#include "cuda/ptx/setmaxnreg.cuh"
#include "cuda/ptx/smem.cuh"
#include "cuda/ptx/tma.cuh"
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

// The forward's d256 64-key block, per consumer warpgroup.
constexpr int kHeadDim = 256;
constexpr int kBlockKeys = 64;
constexpr int kQkSteps = kHeadDim / 16;          // 16 m64n64k16 MMAs
constexpr int kPvSteps = kBlockKeys / 16;        // 4 m64n256k16 MMAs
constexpr int kTileBytes = 64 * kHeadDim * 2;    // 32 KiB: Q (64 rows), K or V (64 keys)
constexpr int kStages = 2;
constexpr int kStageBytes = 2 * kTileBytes;      // K then V
constexpr int kVGroupBytes = 64 * 128;           // V's 64-column groups (64 keys of 128-byte rows)
constexpr int kVStepBytes = 16 * 128;            // a k-step of V: 16 keys
constexpr int kConsumerWarps = kWarpgroups * 4;
constexpr int kForwardThreads = kThreads + 128;   // the consumers and a producer warpgroup (as the kernel's)
constexpr size_t kSourceBytes = size_t{16} << 20;  // K/V source: L2-resident (the H200's L2: 50 MB)
// forward_loop's K and V bytes copied from the L2 per block: 0, kStageBytes (unpaired) or
// kStageBytes / 2 (a pair's share of the L2 reads; a pair's multicast still writes a whole stage
// into each CTA's shared memory, this writes half). The softmax mix always runs on S: without a
// reader of S, ptxas drops every Q K^T whose result the next block's first MMA overwrites (a
// variant without it read 5540 FLOP per SM-cycle, above the tensor cores' 4096).
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

// The softmax's instruction mix on a thread's 32 scores of a 64-key d256 block: their max across
// the row's four threads, exp2 of each against it, the row sum, the conversion to half pairs.
// kRefresh writes the next block's scores over them (new values, so nothing is hoisted), for
// loops whose scores no MMA rewrites.
template <bool kRefresh>
__device__ __forceinline__ void softmax_mix(float (&scores)[kScores], float& row_max, float& row_sum,
                                            uint32_t& packed) {
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
    if constexpr (kRefresh) {
      scores[j] = p1 - 0.5f;
      scores[j + 1] = p0 - 0.5f;
    }
  }
  sum += __shfl_xor_sync(0xffffffffU, sum, 1);
  sum += __shfl_xor_sync(0xffffffffU, sum, 2);
  row_sum = row_sum * 0.5f + sum;
  row_max = block_max * 0.5f;
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
    // The softmax's instruction mix, in flight under the group's MMAs as in the overlapped loop.
    if constexpr (kVariant == Variant::kRegisterASoftmax) softmax_mix<true>(scores, row_max, row_sum, packed);
    ptx::wgmma_wait_group<0>();
  }
  float* row = out + (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) * (kN / 2);
  for (int i = 0; i < kN / 2; ++i) row[i] = d[i];
  if constexpr (kVariant == Variant::kRegisterASoftmax) row[0] += row_sum + row_max + static_cast<float>(packed & 1U);
}

// The forward's block loop at d256 with 64-key blocks (see the top of the file). Warps 0-7: two
// consumer warpgroups (both read the one Q tile: operand reads cost nothing measurable, session
// 72); warps 8-11 the producer, whose warp 8 lane 0 refills each stage once both warpgroups' MMAs
// on it have completed. S is written by the softmax mix after its MMAs complete
// (the next block's first MMA overwrites it), so no other registers hold scores.
// The consumers need O 128 + S 32 + P 16 registers: as in the kernel, the producer warpgroup gives
// its registers to them (288 threads, one producer warp, did not launch at 203 registers each).
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
template <int kLoadBytes>
__global__ void __launch_bounds__(kForwardThreads, 1) forward_loop(float* out, const __half* source, int blocks, uint32_t seed) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t full[kStages], empty[kStages];
  auto* h = reinterpret_cast<__half*>(smem);
  constexpr int kSmemBytes = kTileBytes + kStages * kStageBytes;
  for (int i = threadIdx.x; i < kSmemBytes / 2; i += blockDim.x) h[i] = random_half(i, seed);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumerWarps);
    }
    ptx::fence_barrier_init();
  }
  ptx::fence_proxy_async_shared();
  __syncthreads();
  const uint32_t q_base = ptx::smem_addr(smem), stage_base = q_base + kTileBytes;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp >= kConsumerWarps) {  // the producer
    ptx::setmaxnreg_dec<kProducerRegisters>();
    if (kLoadBytes == 0 || warp != kConsumerWarps || lane != 0) return;
    const size_t span = kSourceBytes / kStageBytes;  // stage-sized pieces of the source
    for (int j = 0; j < blocks; ++j) {
      const int s = j % kStages;
      if (j >= kStages) ptx::mbarrier_wait(&empty[s], ((j / kStages) - 1) & 1);
      const size_t piece = (static_cast<size_t>(blockIdx.x) * 7 + j) % span;
      const unsigned char* src = reinterpret_cast<const unsigned char*>(source) + piece * kStageBytes;
      unsigned char* dst = smem + kTileBytes + s * kStageBytes;
      const uint32_t half_load = kLoadBytes / 2;  // of K, then of V
      ptx::mbarrier_arrive_expect_tx(&full[s], kLoadBytes);
      ptx::bulk_load(dst, src, half_load, &full[s]);
      ptx::bulk_load(dst + kTileBytes, src + kTileBytes, half_load, &full[s]);
    }
  } else {
    ptx::setmaxnreg_inc<kConsumerRegisters>();
    uint32_t p_regs[kPvSteps][4];
#pragma unroll
    for (int k = 0; k < kPvSteps; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const __half2 pair = __halves2half2(random_half(threadIdx.x * 32 + 8 * k + 2 * r, seed ^ 0x55U),
                                            random_half(threadIdx.x * 32 + 8 * k + 2 * r + 1, seed ^ 0x55U));
        p_regs[k][r] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    float s_acc[kScores];
    float o_acc[kHeadDim / 2] = {};
    float row_max = 0.f, row_sum = 0.f;
    uint32_t packed = 0;
    constexpr int kStepsPerSlab = 4;  // 64 columns of a K-major tile
    for (int j = 0; j < blocks; ++j) {
      const int s = kLoadBytes == 0 ? 0 : j % kStages;
      if (kLoadBytes != 0) ptx::mbarrier_wait(&full[s], (j / kStages) & 1);
      const uint32_t k_base = stage_base + s * kStageBytes, v_base = k_base + kTileBytes;
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kQkSteps; ++k) {
        const uint32_t step = (k / kStepsPerSlab) * kSlabBytes + (k % kStepsPerSlab) * kAStepBytes;
        ptx::wgmma_ss<__half, kBlockKeys>(s_acc, ptx::make_smem_desc(q_base + step, 16, kAtom),
                                          ptx::make_smem_desc(k_base + step, 16, kAtom), k > 0);
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < kPvSteps; ++k)
        ptx::wgmma_rs<__half, kHeadDim>(o_acc, p_regs[k], ptx::make_smem_desc(v_base + k * kVStepBytes, kVGroupBytes, kAtom),
                                        true);
      ptx::wgmma_commit_group();
      softmax_mix<false>(s_acc, row_max, row_sum, packed);  // under P V
      ptx::wgmma_wait_group<0>();
      if (kLoadBytes != 0) {
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(&empty[s]);
      }
    }
    float* row = out + (static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x) * (kHeadDim / 2);
    for (int i = 0; i < kHeadDim / 2; ++i) row[i] = o_acc[i];
    row[0] += row_sum + row_max + static_cast<float>(packed & 1U) + s_acc[0];
  }
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

// Runs `launch(seed)` (each launch doing flop_per_launch) back to back for `seconds` after half a
// second's warm-up, and prints the rates over that stretch.
template <typename Launch>
void run(const char* name, double seconds, int sms, double flop_per_launch, Sampler& sampler, Launch launch) {
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
  check(cudaGetLastError(), name);
  double mhz = 0, watts = 0;
  sampler.mean(t0, t1, mhz, watts);
  const double tflops = flop_per_launch * launches / (t1 - t0) / 1e12;
  std::printf("%-18s %8.1f TFLOP/s %6.0f MHz %6.0f W %8.0f FLOP/SM-cycle %8.1f J/PFLOP\n", name, tflops, mhz,
              watts, tflops * 1e12 / (mhz * 1e6 * sms), watts / tflops * 1e3);
  std::fflush(stdout);
}

template <Variant kVariant>
void run_mma(const char* name, double seconds, int sms, float* out, Sampler& sampler) {
  const int smem = kABytes + kBBytes;
  check(cudaFuncSetAttribute(mma_loop<kVariant>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  const int groups = 4096;  // a launch of ~10 ms
  run(name, seconds, sms, kFlopPerMma * kGroupSteps * groups * kWarpgroups * sms, sampler,
      [&](uint32_t seed) { mma_loop<kVariant><<<sms, kThreads, smem>>>(out, groups, seed); });
}

template <int kLoadBytes>
void run_forward(const char* name, double seconds, int sms, float* out, const __half* source, Sampler& sampler) {
  const int smem = kTileBytes + kStages * kStageBytes;
  check(cudaFuncSetAttribute(forward_loop<kLoadBytes>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute");
  const int blocks = 4096;  // a launch of ~10 ms
  const double flop_per_block = 2.0 * 64 * kBlockKeys * kHeadDim * 2;  // Q K^T and P V, per warpgroup
  run(name, seconds, sms, flop_per_block * blocks * kWarpgroups * sms, sampler,
      [&](uint32_t seed) { forward_loop<kLoadBytes><<<sms, kForwardThreads, smem>>>(out, source, blocks, seed); });
}

__global__ void fill_source(__half* source, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * static_cast<size_t>(blockDim.x))
    source[i] = random_half(static_cast<uint32_t>(i), seed);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const std::string data = argc > 2 ? argv[2] : "uniform";
  const std::string set = argc > 3 ? argv[3] : "mma";
  if (data != "uniform" && data != "normal") {
    std::fprintf(stderr, "data: expected uniform or normal, got %s\n", data.c_str());
    return 2;
  }
  if (set != "mma" && set != "forward") {
    std::fprintf(stderr, "set: expected mma or forward, got %s\n", set.c_str());
    return 2;
  }
  const int normal = data == "normal";
  check(cudaMemcpyToSymbol(g_normal_data, &normal, sizeof normal), "data");
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "device");
  float* out = nullptr;
  check(cudaMalloc(&out, static_cast<size_t>(sms) * kThreads * (kHeadDim / 2) * sizeof(float)), "malloc");
  __half* source = nullptr;
  check(cudaMalloc(&source, kSourceBytes), "malloc");
  fill_source<<<sms, 256>>>(source, kSourceBytes / sizeof(__half), 7);
  check(cudaDeviceSynchronize(), "fill");
  Sampler sampler;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::printf("fp16, two warpgroups per SM on %d SMs, %s random operands, %.1f s per run, set %s\n", sms,
              data.c_str(), seconds, set.c_str());
  for (int round = 0; round < 2; ++round) {  // forward, then backward, so a drift in temperature falls on all
    if (set == "mma") {
      if (round == 0) {
        run_mma<Variant::kSharedA>("A in smem", seconds, sms, out, sampler);
        run_mma<Variant::kRegisterA>("A in regs", seconds, sms, out, sampler);
        run_mma<Variant::kRegisterASoftmax>("+ softmax", seconds, sms, out, sampler);
      } else {
        run_mma<Variant::kRegisterASoftmax>("+ softmax", seconds, sms, out, sampler);
        run_mma<Variant::kRegisterA>("A in regs", seconds, sms, out, sampler);
        run_mma<Variant::kSharedA>("A in smem", seconds, sms, out, sampler);
      }
      continue;
    }
    constexpr int kRuns = 4;
    for (int i = 0; i < kRuns; ++i) {
      const int v = round == 0 ? i : kRuns - 1 - i;
      if (v == 0) run_mma<Variant::kRegisterASoftmax>("n128 + softmax", seconds, sms, out, sampler);
      if (v == 1) run_forward<0>("fwd + softmax", seconds, sms, out, source, sampler);
      if (v == 2) run_forward<kStageBytes / 2>("+ half K/V loads", seconds, sms, out, source, sampler);
      if (v == 3) run_forward<kStageBytes>("+ whole K/V loads", seconds, sms, out, source, sampler);
    }
  }
  check(cudaFree(source), "free");
  check(cudaFree(out), "free");
  return 0;
}
