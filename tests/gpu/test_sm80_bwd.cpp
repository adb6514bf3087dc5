// The CUDA backward (sm80 kernels) through the public API against the float64 reference: every
// gradient obeys the 2x rule, and deterministic mode is bit-identical run to run. Out and lse
// come from the reference forward, so these tests judge the backward alone.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fusedattn/attention.h"
#include "gpu/missing_instance.h"
#include "gpu/scoped_env.h"
#include "reference/problems.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

// fp16/bf16 absolute slack of the 2x rule: one storage ulp near 1.
constexpr double kFp16Atol = 1e-3;
constexpr double kBf16Atol = 8e-3;
constexpr int kDeterminismRuns = 3;

double atol_of(DType dtype) { return dtype == DType::kBFloat16 ? kBf16Atol : kFp16Atol; }

void cuda_ok(cudaError_t err) { ASSERT_EQ(err, cudaSuccess) << cudaGetErrorString(err); }

// A device copy of a host tensor with the same strides.
class DeviceTensor {
 public:
  explicit DeviceTensor(HostTensor& host) : host_(&host) {
    cuda_ok(cudaMalloc(&data_, host.nbytes() > 0 ? host.nbytes() : 1));
    upload();
  }
  ~DeviceTensor() { cudaFree(data_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  void upload() { cuda_ok(cudaMemcpy(data_, host_->data(), host_->nbytes(), cudaMemcpyHostToDevice)); }
  void download() { cuda_ok(cudaMemcpy(host_->data(), data_, host_->nbytes(), cudaMemcpyDeviceToHost)); }
  TensorView view() const {
    TensorView v = host_->view();
    v.data = data_;
    v.device = {DeviceType::kCUDA, 0};
    return v;
  }

 private:
  HostTensor* host_;
  void* data_ = nullptr;
};

struct GpuCase {
  Problem problem;
  DType dtype = DType::kFloat16;
  Layout layout = Layout::kBSHD;
  bool deterministic = false;
  double query_gain = 1.0;  // scales q to test large logits
};

std::string name_of(const GpuCase& c) {
  return c.problem.str() + " " + dtype_name(c.dtype) + (c.layout == Layout::kBHSD ? " BHSD" : " BSHD") +
         (c.deterministic ? " deterministic" : "");
}

void check_backward(const GpuCase& gc) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  SCOPED_TRACE(name_of(gc));
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(gc.problem, gc.dtype, gc.layout, rng);
  if (gc.query_gain != 1.0) {
    for (double& x : c.values.q) x = round_to(gc.dtype, x * gc.query_gain);
    refill_inputs(c);
  }
  Tensors ref = c.values;
  reference_forward(gc.problem, ref);
  c.out.fill(ref.out);
  c.lse.fill(ref.lse);
  reference_backward(gc.problem, ref);
  Tensors plain = c.values;
  plain_backward(gc.problem, gc.dtype, plain);

  DeviceTensor q(c.q), k(c.k), v(c.v), out(c.out), lse(c.lse), dout(c.dout), dq(c.dq), dk(c.dk), dv(c.dv);
  std::vector<std::unique_ptr<DeviceTensor>> cu;
  BackwardArgs a = backward_args(c);
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view(), a.lse = lse.view(), a.dout = dout.view();
  a.dq = dq.view(), a.dk = dk.view(), a.dv = dv.view();
  if (gc.problem.varlen()) {
    cu.push_back(std::make_unique<DeviceTensor>(c.cu_q));
    cu.push_back(std::make_unique<DeviceTensor>(c.cu_k));
    a.options.cu_seqlens_q = cu[0]->view();
    a.options.cu_seqlens_k = cu[1]->view();
  }
  a.deterministic = gc.deterministic;

  std::vector<unsigned char> first[3];
  HostTensor* grads[3] = {&c.dq, &c.dk, &c.dv};
  DeviceTensor* dgrads[3] = {&dq, &dk, &dv};
  const int runs = gc.deterministic ? kDeterminismRuns : 1;
  for (int run = 0; run < runs; ++run) {
    for (int i = 0; i < 3; ++i) {
      grads[i]->poison();
      dgrads[i]->upload();
    }
    // A build without this head dim's instance (GPU_HEAD_DIMS) skips, as the other suites do.
    FUSEDATTN_RUN_OR_SKIP(run_unless_missing([&] { backward(a); }));
    cuda_ok(cudaDeviceSynchronize());
    for (int i = 0; i < 3; ++i) dgrads[i]->download();
    if (run == 0) {
      const double atol = atol_of(gc.dtype) * gc.query_gain;
      EXPECT_TRUE(obeys_2x_rule(c.dq.to_double(), plain.dq, ref.dq, atol)) << "dq";
      EXPECT_TRUE(obeys_2x_rule(c.dk.to_double(), plain.dk, ref.dk, atol)) << "dk";
      EXPECT_TRUE(obeys_2x_rule(c.dv.to_double(), plain.dv, ref.dv, atol)) << "dv";
      for (int i = 0; i < 3; ++i) {
        const auto* bytes = static_cast<const unsigned char*>(grads[i]->data());
        first[i].assign(bytes, bytes + grads[i]->nbytes());
      }
    } else {
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(std::memcmp(first[i].data(), grads[i]->data(), first[i].size()), 0)
            << "gradient " << i << " (dq, dk, dv) differs on run " << run;
    }
  }
}

Problem causal(Problem p) {
  p.causal = true;
  return p;
}
Problem window(Problem p, int64_t left, int64_t right) {
  p.window_left = left, p.window_right = right;
  return p;
}
Problem varlen(Problem p, std::vector<int64_t> lens_q, std::vector<int64_t> lens_k) {
  p.batch = static_cast<int>(lens_q.size());
  p.lens_q = std::move(lens_q);
  p.lens_k = std::move(lens_k);
  return p;
}

class Sm80Backward : public ::testing::TestWithParam<DType> {};

TEST_P(Sm80Backward, RaggedLengths) { check_backward({dense(2, 4, 4, 77, 133, 64), GetParam()}); }
TEST_P(Sm80Backward, CausalMoreQueriesThanKeys) {
  check_backward({causal(dense(1, 2, 2, 200, 130, 128)), GetParam()});  // leading rows see no key
}
TEST_P(Sm80Backward, CausalBhsdLayout) {
  check_backward({causal(dense(1, 2, 2, 130, 300, 128)), GetParam(), Layout::kBHSD});
}
TEST_P(Sm80Backward, SlidingWindow) { check_backward({window(dense(1, 2, 1, 257, 300, 64), 40, 10), GetParam()}); }
TEST_P(Sm80Backward, NarrowWindowFewKeys) { check_backward({window(dense(1, 2, 2, 300, 5, 64), 3, 0), GetParam()}); }
TEST_P(Sm80Backward, GroupedQueryCausal) { check_backward({causal(dense(2, 6, 2, 150, 150, 128)), GetParam()}); }
TEST_P(Sm80Backward, SingleQueryMultiQueryAttention) { check_backward({dense(1, 3, 1, 1, 400, 64), GetParam()}); }
TEST_P(Sm80Backward, VarlenCausalWithEmptySequences) {
  check_backward({varlen(causal(dense(0, 4, 2, 0, 0, 64)), {17, 0, 130, 64}, {40, 33, 130, 1}), GetParam()});
}
TEST_P(Sm80Backward, VarlenWindow) {
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 128), 20, 5), {100, 200, 7}, {250, 90, 7}), GetParam()});
}
TEST_P(Sm80Backward, HeadDimsBelowInstance) {
  for (int d : {40, 112}) check_backward({causal(dense(1, 2, 2, 150, 170, d)), GetParam()});
}
TEST_P(Sm80Backward, LargeLogits) { check_backward({dense(1, 2, 2, 200, 200, 64), GetParam(), Layout::kBSHD, false, 100.0}); }
TEST_P(Sm80Backward, DeterministicCausalGqa) {
  check_backward({causal(dense(2, 4, 2, 300, 400, 128)), GetParam(), Layout::kBSHD, true});
}
TEST_P(Sm80Backward, DeterministicVarlenWindow) {
  check_backward({varlen(window(dense(0, 4, 4, 0, 0, 64), 50, 0), {300, 1, 129}, {310, 64, 100}), GetParam(),
                  Layout::kBSHD, true});
}
// Head dims above 128 split the output columns over warps that share key rows (P^T and dS^T go
// through shared memory): causal GQA with ragged lengths, a window over varlen sequences in
// deterministic mode, and head dims below the instance (zero-filled columns of the last warp).
TEST_P(Sm80Backward, WideHeadCausalGqa) { check_backward({causal(dense(2, 4, 2, 150, 170, 256)), GetParam()}); }
TEST_P(Sm80Backward, WideHeadDeterministicVarlenWindow) {
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 256), 30, 7), {70, 129, 1}, {100, 64, 9}), GetParam(),
                  Layout::kBSHD, true});
}
TEST_P(Sm80Backward, WideHeadDimsBelowInstance) {
  for (int d : {136, 200}) check_backward({dense(1, 2, 1, 97, 130, d), GetParam(), Layout::kBHSD});
}
TEST_P(Sm80Backward, Head192CausalGqa) { check_backward({causal(dense(2, 4, 2, 150, 170, 192)), GetParam()}); }

// The backward's default (A100-sized) tiles, which Hopper replaces with larger-memory ones, checked
// on Hopper too.
TEST_P(Sm80Backward, WideHeadSm80Tiles) {
  const ScopedEnv sm80_tiles("FUSEDATTN_BWD_SM80_TILE", "1");
  check_backward({causal(dense(2, 4, 2, 150, 170, 256)), GetParam()});
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 256), 30, 7), {70, 129, 1}, {100, 64, 9}), GetParam(),
                  Layout::kBSHD, true});
}
// d64 and d128 take other layouts where Hopper's memory allows (column warps, a dQ staging
// buffer of their own); their A100-sized tiles, checked on Hopper too.
TEST_P(Sm80Backward, Sm80TilesHead64And128) {
  const ScopedEnv sm80_tiles("FUSEDATTN_BWD_SM80_TILE", "1");
  check_backward({causal(dense(2, 4, 2, 150, 170, 64)), GetParam()});
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 128), 30, 7), {70, 129, 1}, {100, 64, 9}), GetParam(),
                  Layout::kBSHD, true});
  check_backward({dense(1, 4, 2, 77, 133, 128), GetParam()});
}
// d64's Hopper row keeps each warp's K and V rows in registers (loaded once per CTA; on GPUs
// without its shared memory this checks the A100-sized tile again): causal GQA with ragged lengths
// and several query blocks per CTA, a deterministic varlen window, large logits, head dims below
// the instance. *Sanitizer* in the name: tools/gpu_check.sh runs it under compute-sanitizer.
TEST_P(Sm80Backward, SanitizerKvRegistersHead64) {
  check_backward({causal(dense(2, 4, 2, 300, 410, 64)), GetParam()});
  check_backward({varlen(window(dense(0, 2, 2, 0, 0, 64), 50, 0), {300, 1, 129}, {310, 64, 100}), GetParam(),
                  Layout::kBSHD, true});
  check_backward({dense(1, 2, 2, 200, 200, 64), GetParam(), Layout::kBSHD, false, 100.0});
  check_backward({dense(1, 2, 1, 97, 260, 48), GetParam(), Layout::kBHSD});
}
// Small shapes for compute-sanitizer (tools/gpu_check.sh runs tests matching *Sanitizer*): every
// tile family (d32 per-warp dQ adds, d64/d128 dQ staging buffers, d256 column passes).
TEST_P(Sm80Backward, SanitizerSmallRagged) {
  check_backward({causal(dense(2, 2, 1, 77, 133, 64)), GetParam()});
  check_backward({varlen(causal(dense(0, 2, 2, 0, 0, 40)), {17, 0, 70}, {40, 33, 20}), GetParam(), Layout::kBSHD, true});
  check_backward({causal(dense(1, 2, 1, 70, 90, 256)), GetParam()});
  check_backward({window(dense(1, 2, 1, 70, 90, 128), 20, 5), GetParam()});
  check_backward({causal(dense(1, 2, 2, 90, 70, 32)), GetParam()});
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Sm80Backward, ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace fusedattn::testing
