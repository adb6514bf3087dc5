// merge_attention on the CUDA backend (fusedattn/merge.h): the cases of reference/merge_case.h
// (which the CPU suite runs too) on the device: every pair of dtypes on the vector path, head dims
// that take vectors of 4 or single elements, slices of longer tensors dense and varlen and heads first, and a call
// on a stream of its own; a tensor on another device rejected by name.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "fusedattn/merge.h"
#include "gpu/gpu_util.h"
#include "reference/merge_case.h"

namespace fusedattn::testing {
namespace {

constexpr DType kFloatDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// Runs the case's merge on device copies of its tensors (on `stream`), and brings out and lse back.
// `captured`: the call is captured on `stream` into a CUDA graph, which then runs once
// (run_captured, gpu_util.h), and the graph must hold its kernel: a merge launched on another
// stream, the legacy one included, would be missing from it.
void merge_on_device(MergeCase& c, cudaStream_t stream = nullptr, bool captured = false) {
  std::map<const HostTensor*, DeviceTensor> copies;
  for (HostTensor* t : {&c.out, &c.lse, &c.part_out, &c.part_lse}) copies.emplace(t, DeviceTensor(*t));
  MergeArgs a = c.args([&](HostTensor& t) { return copies.at(&t).view(t); });
  a.stream = stream;
  if (captured) {
    EXPECT_GE(run_captured(stream, [&] { merge_attention(a); }), 1)
        << "the graph captured on the caller's stream holds no kernel of the merge";
  } else {
    merge_attention(a);
  }
  cuda_check(cudaDeviceSynchronize(), "merge_attention");
  copies.at(&c.out).download(c.out);
  copies.at(&c.lse).download(c.lse);
}

void expect_merged(const MergeShape& shape, DType out_dtype, DType part_dtype) {
  std::mt19937_64 rng = fresh_rng();
  MergeCase c(shape, out_dtype, part_dtype, rng);
  merge_on_device(c);
  EXPECT_TRUE(c.check()) << "out " << dtype_name(out_dtype) << ", part_out " << dtype_name(part_dtype) << ", dim "
                         << shape.dim;
}

TEST(GpuMerge, EveryPairOfDtypesMatchesTheAttentionOverBothKeySets) {
  FUSEDATTN_REQUIRE_GPU();
  for (DType out : kFloatDtypes)
    for (DType part : kFloatDtypes) {
      expect_merged({2, 50, 3, 40}, out, part);   // vectors, a row's lanes fewer than a warp
      expect_merged({1, 20, 2, 256}, out, part);  // vectors, a warp's lanes twice over a row
    }
}

TEST(GpuMerge, HeadDimsOfNarrowerVectorsAndSingleElements) {
  FUSEDATTN_REQUIRE_GPU();
  expect_merged({2, 9, 3, 36}, DType::kFloat16, DType::kFloat32);  // vectors of 4
  expect_merged({1, 7, 5, 20}, DType::kBFloat16, DType::kFloat16);
  expect_merged({1, 11, 2, 6}, DType::kFloat32, DType::kFloat16);
  expect_merged({2, 5, 3, 1}, DType::kFloat16, DType::kFloat32);
  expect_merged({2, 9, 3, 66}, DType::kBFloat16, DType::kBFloat16);
  expect_merged({2, 5, 3, 0}, DType::kFloat32, DType::kFloat32);  // only the LSEs merge
}

TEST(GpuMerge, SlicesOfLongerTensorsDenseVarlenAndHeadsFirst) {
  FUSEDATTN_REQUIRE_GPU();
  expect_merged({.batch = 2, .seqlen = 9, .heads = 3, .dim = 24, .rows_around = 4}, DType::kFloat32,
                DType::kFloat16);
  expect_merged({.batch = 1, .seqlen = 13, .heads = 2, .dim = 16, .varlen = true, .rows_around = 5},
                DType::kFloat32, DType::kBFloat16);
  expect_merged({.batch = 2, .seqlen = 7, .heads = 4, .dim = 32, .rows_around = 3, .layout = Layout::kBHSD},
                DType::kBFloat16, DType::kBFloat16);
}

TEST(GpuMerge, RunsOnTheCallersStream) {
  FUSEDATTN_REQUIRE_GPU();
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::mt19937_64 rng = fresh_rng();
  MergeCase c({4, 300, 8, 128}, DType::kFloat32, DType::kFloat16, rng);
  merge_on_device(c, stream, /*captured=*/true);
  EXPECT_TRUE(c.check());
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST(GpuMerge, RejectsATensorOnAnotherDevice) {
  FUSEDATTN_REQUIRE_GPU();
  std::mt19937_64 rng = fresh_rng();
  MergeCase c({1, 4, 2, 8}, DType::kFloat32, DType::kFloat32, rng);
  DeviceTensor out(c.out), lse(c.lse);
  MergeArgs a = c.args([](HostTensor& t) { return t.view(); });  // part_out and part_lse stay on the host
  a.out = out.view(c.out);
  a.lse = lse.view(c.lse);
  expect_error([&] { merge_attention(a); }, ErrorCode::kDeviceMismatch, "part_out", "out's device");
}

}  // namespace
}  // namespace fusedattn::testing
