// append_kv on the CUDA backend (fusedattn/kv_cache.h): the caches and statuses of the rules
// (reference/append_case.h, which the CPU suite runs too), per-sequence and paged; bf16 bits moved
// as they are (the copy is by element size); and a step captured in a CUDA graph that appends at
// the lengths its tensors hold at each replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fusedattn/kv_cache.h"
#include "gpu/gpu_util.h"
#include "reference/append_case.h"

namespace fusedattn::testing {
namespace {

// A device copy of a host vector, copied back by `download`.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : size_(host.size()) {
    cuda_check(cudaMalloc(&ptr_, bytes() > 0 ? bytes() : 1), "cudaMalloc");
    upload(host);
  }
  ~DeviceVector() { cudaFree(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  void upload(const std::vector<T>& host) {
    cuda_check(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    cuda_check(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  T* data() const { return ptr_; }

 private:
  std::size_t bytes() const { return size_ * sizeof(T); }
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

// The case's tensors on the GPU, its views pointed at them.
struct OnDevice {
  DeviceVector<float> k_cache, v_cache, k, v;
  DeviceVector<int32_t> lengths, table, status;
  AppendKvArgs args;
  OnDevice(AppendCase& c, DType dtype, std::vector<int32_t>& host_status)
      : k_cache(c.k_cache), v_cache(c.v_cache), k(c.k), v(c.v), lengths(c.lengths),
        table(c.paged ? c.table : std::vector<int32_t>{0}), status(std::vector<int32_t>(c.batch, -7)) {
    args = c.args(host_status);
    const auto on_gpu = [&](TensorView& t, void* data, DType as) {
      t.data = data;
      t.device = kGpu;
      t.dtype = as;
    };
    // A bf16 view of the fp32 values has a head dim twice as long: the same bytes, moved as pairs.
    for (auto [t, d] : {std::pair{&args.k_cache, k_cache.data()}, {&args.v_cache, v_cache.data()},
                        {&args.k, k.data()}, {&args.v, v.data()}}) {
      on_gpu(*t, d, dtype);
      if (dtype != DType::kFloat32) {
        t->shape[3] *= 2;
        for (int i = 0; i < 3; ++i) t->stride[i] *= 2;
      }
    }
    on_gpu(args.cache_seqlens, lengths.data(), DType::kInt32);
    if (c.paged) on_gpu(args.block_table, table.data(), DType::kInt32);
    on_gpu(args.status, status.data(), DType::kInt32);
  }
};

void expect_as_the_rules_say(AppendCase c, DType dtype) {
  SCOPED_TRACE(dtype_name(dtype));
  std::vector<float> k_want, v_want;
  std::vector<int32_t> status_want, unused;
  c.expected(k_want, v_want, status_want);
  OnDevice d(c, dtype, unused);
  append_kv(d.args);
  cuda_check(cudaDeviceSynchronize(), "append_kv");
  EXPECT_EQ(d.status.download(), status_want);
  EXPECT_TRUE(d.k_cache.download() == k_want) << "k_cache";
  EXPECT_TRUE(d.v_cache.download() == v_want) << "v_cache";
}

TEST(GpuAppendKv, MatchesTheRules) {
  FUSEDATTN_REQUIRE_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::mt19937_64 rng = fresh_rng();
    expect_as_the_rules_say(AppendCase({3, 0, 38, 39, -1}, 2, 2, 24, 40, 1, false, rng), dtype);
    AppendCase paged({5, 14, 0, 30, 31}, 3, 2, 16, 8, 4, true, rng);
    paged.table[1 * 4 + 2] = static_cast<int32_t>(paged.num_pages);
    expect_as_the_rules_say(paged, dtype);
    expect_as_the_rules_say(AppendCase({0, 40, 41}, 0, 2, 8, 40, 1, false, rng), dtype);
  }
}

// Captured once on a non-blocking stream; each replay appends where the lengths then say.
TEST(GpuAppendKv, ReplaysTheLengthsItFinds) {
  FUSEDATTN_REQUIRE_GPU();
  std::mt19937_64 rng = fresh_rng();
  AppendCase c({3, 0, 9}, 1, 2, 16, 32, 1, false, rng);
  std::vector<int32_t> unused;
  OnDevice d(c, DType::kFloat32, unused);
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  d.args.stream = stream;
  const CapturedGraph graph(stream, [&] { append_kv(d.args); });
  for (const std::vector<int32_t>& lengths : {std::vector<int32_t>{31, 5, 0}, std::vector<int32_t>{32, 1, 17}}) {
    c.lengths = lengths;
    d.lengths.upload(lengths);
    c.k_cache = d.k_cache.download();
    c.v_cache = d.v_cache.download();
    std::vector<float> k_want, v_want;
    std::vector<int32_t> status_want;
    c.expected(k_want, v_want, status_want);
    cuda_check(cudaDeviceSynchronize(), "lengths in place");  // the upload is on the legacy stream
    graph.replay();
    EXPECT_EQ(d.status.download(), status_want);
    EXPECT_TRUE(d.k_cache.download() == k_want && d.v_cache.download() == v_want);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace fusedattn::testing
