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
#include <vector>

#include "fusedattn/attention.h"
#include "gpu/dependent_launch_kernels.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"

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
  for (const Problem& pr : problems) {
    for (DType dtype : kGpuDtypes) {
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
      if (skip_warm) GTEST_SKIP() << *skip_warm;
      dc.out.poison();
      dc.lse.poison();
      const DeviceCopy copies[] = {{dc.k.data(), final_k.data(), c.k.nbytes()},
                                   {out_snapshot.data(), dc.out.data(), c.out.nbytes()}};
      cuda_check(launch_late_copies(copies, 2, kLateNs, stream.s), "late copies");
      const SkipReason skip = run_unless_missing([&] { fusedattn::forward(args); });
      cuda_check(cudaStreamSynchronize(stream.s), "forward");
      if (skip) GTEST_SKIP() << *skip;
      dc.out.download(c.out);
      dc.lse.download(c.lse);
      HostTensor snapshot = c.out;
      out_snapshot.download(snapshot);
      EXPECT_TRUE(all_poison(bytes_of(snapshot))) << "O written before the kernel before it had read it: "
                                                   << case_name(c);
      Tensors ref = c.values, plain = c.values;
      reference_forward(pr, ref);
      plain_forward(pr, dtype, plain);
      EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(dtype))) << "out of " << case_name(c);
      EXPECT_TRUE(obeys_2x_rule(c.lse.to_double(), plain.lse, ref.lse, kLseAtol)) << "lse of " << case_name(c);
    }
  }
  if (!early) GTEST_SKIP() << "this device started no dependent launch before the kernel ahead of it ended";
}

}  // namespace
}  // namespace fusedattn::testing
