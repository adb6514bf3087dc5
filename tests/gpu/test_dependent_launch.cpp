// The Hopper forward as a dependent launch (programmatic stream serialisation, fwd_launch.cuh's
// dependent_launch): its CTAs may start while the kernel before it on the stream still runs, so
// the kernel waits for that one before it reads an input or writes an output (kernel.cuh). Here
// the kernel before it lets dependents start at once and does its writes late: the final K lands
// and a snapshot of O is taken a while after the forward's launch. The forward must compute with
// the final K and must not have written O before the snapshot. A dependent peek that reads
// without waiting first shows that this device starts such launches early at all; where it does
// not, nothing here could fail, and the test says so by skipping. Every kernel runs once before
// it is watched: a module loaded lazily (CUDA_MODULE_LOADING=LAZY, the default) is loaded at its
// first launch, and a dependent launch that loads one does not start early
// (tools/pdl_probe.cu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "fusedattn/attention.h"
#include "gpu/dependent_launch_kernels.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"

namespace fusedattn::testing {
namespace {

// Long beside a forward of these shapes (tens of microseconds), short for a test.
constexpr uint64_t kLateNs = 2'000'000;

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Whether a dependent launch behind launch_late_copies reads a word before the late copy lands:
// the device word starts as `stale` and is replaced late by `final_word`.
bool starts_early(const Stream& stream) {
  const uint32_t stale = 0x01234567u, final_word = 0x89abcdefu;
  uint32_t* words = nullptr;  // [0] the target, [4] the final word (16-byte aligned), [8] what the peek saw
  cuda_check(cudaMalloc(&words, 12 * sizeof(uint32_t)), "words");
  const uint32_t init[12] = {stale, 0, 0, 0, final_word, 0, 0, 0, 0, 0, 0, 0};
  cuda_check(cudaMemcpy(words, init, sizeof(init), cudaMemcpyHostToDevice), "words");
  const DeviceCopy copy{words, words + 4, 16};
  cuda_check(launch_early_peek(words, words + 8, stream.s), "peek");  // loaded before it is watched
  cuda_check(cudaMemcpyAsync(words, init, sizeof(init), cudaMemcpyHostToDevice, stream.s), "words");
  cuda_check(launch_late_copies(&copy, 1, kLateNs, stream.s), "late copy");
  cuda_check(launch_early_peek(words, words + 8, stream.s), "peek");
  cuda_check(cudaStreamSynchronize(stream.s), "peek");
  uint32_t back[12];
  cuda_check(cudaMemcpy(back, words, sizeof(back), cudaMemcpyDeviceToHost), "words");
  cudaFree(words);
  EXPECT_EQ(back[0], final_word) << "the late copy did not land";
  return back[8] == stale;
}

bool all_poison(const std::vector<unsigned char>& bytes) {
  for (unsigned char b : bytes)
    if (b != kPoisonByte) return false;
  return true;
}

// pr's forward on `stream` behind launch_late_copies: K holds other values until the final K
// lands late, and O's snapshot is taken late. The forward must compute with the final K and must
// not have written O before the snapshot.
SkipReason check_behind_late_copies(const Problem& pr, DType dtype, const Stream& stream, std::mt19937_64& rng) {
  HostCase c = make_case(pr, dtype, Layout::kBSHD, rng);
  HostCase stale = make_case(pr, dtype, Layout::kBSHD, rng);  // other values where K will be
  DeviceCase dc(c);
  const DeviceTensor final_k(c.k);
  dc.k.upload(stale.k);
  DeviceTensor out_snapshot(c.out);
  ForwardArgs args = dc.forward_args();
  args.options.stream = stream.s;
  // Once unwatched, so that the forward's kernels are loaded (and its workspaces made).
  const SkipReason skip_warm = run_unless_missing([&] { fusedattn::forward(args); });
  cuda_check(cudaStreamSynchronize(stream.s), "forward");
  if (skip_warm) return skip_warm;
  dc.out.poison();
  dc.lse.poison();
  const DeviceCopy copies[] = {{dc.k.data(), final_k.data(), c.k.nbytes()},
                               {out_snapshot.data(), dc.out.data(), c.out.nbytes()}};
  cuda_check(launch_late_copies(copies, 2, kLateNs, stream.s), "late copies");
  const SkipReason skip = run_unless_missing([&] { fusedattn::forward(args); });
  cuda_check(cudaStreamSynchronize(stream.s), "forward");
  if (skip) return skip;
  dc.out.download(c.out);
  dc.lse.download(c.lse);
  HostTensor snapshot = c.out;
  out_snapshot.download(snapshot);
  EXPECT_TRUE(all_poison(bytes_of(snapshot))) << "O written before the kernel before it had read it: " << case_name(c);
  expect_forward_matches_reference(c);
  return std::nullopt;
}

TEST(Sm90DependentLaunch, WaitsForTheKernelBefore) {
  SKIP_UNLESS_HOPPER();
  const ScopedEnv dependent("FUSEDATTN_SM90_PDL", "1");
  const Stream stream;
  const bool early = starts_early(stream);
  auto rng = fresh_rng();
  // A decode step (one query, GQA groups packed, keys split), a causal prefill of ragged
  // lengths, and a full-mask launch of fewer tiles than SMs, split into parts (small enough for
  // the float64 reference: the whole test takes a few seconds).
  const Problem problems[] = {
      with_mask(dense(2, 32, 8, 1, 4096, 128), false, -1, -1),
      with_mask(dense(2, 4, 2, 700, 650, 128), true, -1, -1),
      with_mask(dense(1, 4, 4, 512, 2048, 128), false, -1, -1),
  };
  for (const Problem& pr : problems)
    for (DType dtype : kGpuDtypes) FUSEDATTN_RUN_OR_SKIP(check_behind_late_copies(pr, dtype, stream, rng));
  if (!early) GTEST_SKIP() << "this device started no dependent launch before the kernel ahead of it ended";
}

// Two calls of pr back to back on `stream`, the second's Q the first's O (poisoned before: NaN
// wherever the second call reads it before the first call wrote it); checks the second.
SkipReason check_back_to_back(const Problem& pr, DType dtype, const Stream& stream, std::mt19937_64& rng) {
  HostCase first = make_case(pr, dtype, Layout::kBSHD, rng);
  HostCase second = make_case(pr, dtype, Layout::kBSHD, rng);
  DeviceCase d1(first), d2(second);
  d1.out.poison();
  d2.out.poison();
  d2.lse.poison();
  ForwardArgs a1 = d1.forward_args(), a2 = d2.forward_args();
  a2.q = d1.out.view(first.out);
  a1.options.stream = a2.options.stream = stream.s;
  const SkipReason skip = run_unless_missing([&] {
    fusedattn::forward(a1);
    fusedattn::forward(a2);
  });
  cuda_check(cudaStreamSynchronize(stream.s), "forward");
  if (skip) return skip;
  d1.out.download(second.q);
  second.values.q = second.q.to_double();
  d2.out.download(second.out);
  d2.lse.download(second.lse);
  expect_forward_matches_reference(second);
  return std::nullopt;
}

// The d256 full-mask quad mix (launch_quad_mix: quads on the caller's stream, pairs on a second
// one), in each dtype behind the late copies, then two calls back to back, so that the second
// call's launches follow the first call's join. 62 heads of four query blocks give the quads and
// the pairs beside them work, of eight the octets; one key block keeps the float64 reference to
// seconds.
TEST(Sm90DependentLaunch, QuadMixWaitsForTheKernelBefore) {
  SKIP_UNLESS_HOPPER();
  // Forced: by default the pairs (and so the mix) start at kPairClusterMinKeys keys.
  const ScopedEnvs mix({{"FUSEDATTN_SM90_PDL", "1"},
                        {"FUSEDATTN_SM90_CLUSTER", "1"},
                        {"FUSEDATTN_SM90_QUAD_MIX", ""},
                        {"FUSEDATTN_SM90_MIX_CLUSTER", ""}});
  const Problem problems[] = {with_mask(dense(1, 62, 62, 512, 50, 256), false, -1, -1),
                              with_mask(dense(1, 62, 62, 1024, 50, 256), false, -1, -1)};
  for (const Problem& pr : problems)
    for (DType dtype : kGpuDtypes) {
      SkipReason skipped;
      const auto w = expect_sm90_work(pr, dtype, skipped);
      if (!w) {
        FUSEDATTN_RUN_OR_SKIP(skipped);
        return;  // a failure is recorded (expect_sm90_work)
      }
      if (w->quad_mix_ctas == 0) GTEST_SKIP() << "this GPU runs no quad mix (no quad beside pairs on every SM)";
    }
  const Stream stream;
  const bool early = starts_early(stream);
  auto rng = fresh_rng();
  for (const Problem& pr : problems)
    for (DType dtype : kGpuDtypes) {
      FUSEDATTN_RUN_OR_SKIP(check_behind_late_copies(pr, dtype, stream, rng));
      FUSEDATTN_RUN_OR_SKIP(check_back_to_back(pr, dtype, stream, rng));
    }
  if (!early) GTEST_SKIP() << "this device started no dependent launch before the kernel ahead of it ended";
}

}  // namespace
}  // namespace fusedattn::testing
