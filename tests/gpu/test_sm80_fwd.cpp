// The portable sm80 forward kernel through the public API, with the Hopper path disabled
// (FUSEDATTN_DISABLE_SM90=1) so every call lands on it, also on an H100/H200: out and LSE against
// the float64 reference under the 2x rule, on ragged lengths, every mask shape (causal with
// Sq != Sk, sliding windows, fully masked rows), GQA/MQA, varlen with empty sequences, both
// layouts, head dims served by a larger instance, large logits, a negative scale, NaN
// confinement and a null LSE. Outputs are poisoned before every run; inputs are fresh.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_check.h"  // dense(), packed(), with_mask(), atol_for()
#include "cuda/dispatch.h"
#include "cuda/sm80/fwd_kv_split.h"
#include "cuda/sm80/tile_config.h"
#include "gpu/missing_instance.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"  // planning_params()
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

// LSE is fp32 everywhere; the kernel's exp2/log2 path differs from the reference's by a few ulps
// of the row maximum (logits reach ~50 with q scaled by 100).
constexpr double kGpuLseAtol = 1e-3, kGpuLseRtol = 1e-5;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of a HostTensor, copied back on request.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(HostTensor& t) : host_(&t), bytes_(t.nbytes()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, t.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  TensorView view() const {
    TensorView v = host_->view();
    v.data = ptr_;
    v.device = {DeviceType::kCUDA, 0};
    return v;
  }
  void copy_back() const { EXPECT_EQ(cudaMemcpy(host_->data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess); }

 private:
  HostTensor* host_;
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

class Sm80Forward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  }
  PortablePathOnly portable_;
};

// Runs c on the GPU (out and lse poisoned on the device too) and copies the results back.
void run_on_gpu(HostCase& c, bool with_lse = true) {
  c.out.poison();
  c.lse.poison();
  DeviceBuffer q(c.q), k(c.k), v(c.v), out(c.out), lse(c.lse);
  std::unique_ptr<DeviceBuffer> cu_q, cu_k, used_k;
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  if (with_lse) a.lse = lse.view();
  if (c.problem.varlen()) {
    cu_q = std::make_unique<DeviceBuffer>(c.cu_q);
    cu_k = std::make_unique<DeviceBuffer>(c.cu_k);
    if (!c.problem.seqused_k.empty()) used_k = std::make_unique<DeviceBuffer>(c.used_k);
    a.options = options_for(c.problem, cu_q->view(), cu_k->view(), used_k ? used_k->view() : TensorView{});
  } else {
    a.options = options_for(c.problem);
  }
  a.options.backend = Backend::kCUDA;
  forward(a);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.copy_back();
  lse.copy_back();
}

// Fresh inputs (q scaled by q_scale, then reshaped by `shape` if given), a GPU run, and the 2x
// rule on out plus a tolerance on lse.
void check(const Problem& p, DType dtype, Layout layout = Layout::kBSHD, double q_scale = 1.0,
           const std::function<void(Tensors&)>& shape = {}) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, layout, rng);
  if (q_scale != 1.0)
    for (double& x : c.values.q) x = round_to(dtype, x * q_scale);
  if (shape) shape(c.values);
  if (q_scale != 1.0 || shape) refill_inputs(c);
  run_on_gpu(c);
  Tensors ref = c.values, plain = c.values;
  reference_forward(p, ref);
  plain_forward(p, dtype, plain);
  const std::string name = p.str() + " " + dtype_name(dtype) + (layout == Layout::kBHSD ? " BHSD" : "");
  EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(dtype))) << "out of " << name;
  EXPECT_TRUE(all_close(c.lse.to_double(), ref.lse, kGpuLseAtol, kGpuLseRtol)) << "lse of " << name;
}

const DType kDtypes[] = {DType::kFloat16, DType::kBFloat16};

// The parts the portable launch cuts each tile's keys into on the instance of kHeadDim.
template <int kHeadDim>
int kv_parts_on(const FwdParams& p) {
  using Cfg = cuda::sm80::FwdConfig<kHeadDim>;
  return cuda::sm80::kv_split_parts_for(p, Cfg::kBlockM, Cfg::kMinBlocksPerSm);
}

// The key split's parts for pr on the portable forward (fwd_launch.cuh, run_fwd): 1 where it does
// not split (masked launches, launches that fill the GPU, FUSEDATTN_SM80_KV_SPLIT=0). Throws the
// dispatcher's error where this build has no instance for pr (run_unless_missing turns it into a
// skip).
int planned_kv_parts(const Problem& pr, DType dtype) {
  const FwdParams params = planning_params(pr, dtype);
  const int instance = cuda::choose_forward(params, 8, 0).instance_head_dim;  // the portable instance
  if (params.is_masked()) return 1;
  const FwdParams p = cuda::sm80::launch_view(params);
  switch (instance) {
    case 32: return kv_parts_on<32>(p);
    case 64: return kv_parts_on<64>(p);
    case 96: return kv_parts_on<96>(p);
    case 128: return kv_parts_on<128>(p);
    case 192: return kv_parts_on<192>(p);
    default: return kv_parts_on<256>(p);
  }
}

// check() of a launch meant to split its keys: first asserts that its plan does.
void check_split(const Problem& p, DType dtype, Layout layout = Layout::kBSHD) {
  EXPECT_GE(planned_kv_parts(p, dtype), 2) << p.str() << ": the launch does not split its keys";
  check(p, dtype, layout);
}

TEST_F(Sm80Forward, RaggedDenseShapes) {
  for (DType dt : kDtypes)
    for (int d : {64, 128})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {100, 77}, {129, 300}, {257, 64}, {64, 513}})
        check(dense(2, 3, 3, sq, sk, d), dt);
}

TEST_F(Sm80Forward, CausalAndWindowsBottomRightAligned) {
  for (DType dt : kDtypes)
    for (int d : {64, 128}) {
      check(with_mask(dense(2, 2, 2, 300, 300, d), true, -1, -1), dt);
      check(with_mask(dense(1, 2, 2, 300, 130, d), true, -1, -1), dt);  // Sq > Sk: top rows see nothing
      check(with_mask(dense(1, 2, 2, 77, 400, d), true, -1, -1), dt);   // Sq < Sk
      check(with_mask(dense(1, 2, 1, 333, 333, d), false, 50, 7), dt);
      check(with_mask(dense(1, 2, 1, 200, 260, d), false, 0, 0), dt);  // diagonal only
      check(with_mask(dense(1, 1, 1, 260, 200, d), false, -1, 33), dt);
      check(with_mask(dense(1, 1, 1, 260, 200, d), false, 70, -1), dt);
      check(with_mask(dense(1, 1, 1, 150, 150, d), false, 500, 500), dt);  // window wider than S
    }
}

TEST_F(Sm80Forward, GroupedAndMultiQueryHeads) {
  for (DType dt : kDtypes) {
    check(dense(2, 8, 2, 190, 190, 64), dt);
    check(with_mask(dense(1, 6, 1, 140, 170, 128), true, -1, -1), dt);
  }
}

// One query row per sequence with grouped heads runs as the group's rows of its KV head
// (params.h, decode_groups_as_rows): full and causal masks (one row: the same keys), both layouts,
// MQA; a window, which the view does not take, alongside.
TEST_F(Sm80Forward, DecodeGroupsReadAsRows) {
  for (DType dt : kDtypes)
    for (int d : {64, 128})
      for (int64_t sk : {1, 77, 1000}) {
        check(dense(3, 8, 2, 1, sk, d), dt);
        check(with_mask(dense(2, 8, 2, 1, sk, d), true, -1, -1), dt, Layout::kBHSD);
        check(dense(2, 6, 1, 1, sk, d), dt, Layout::kBHSD);
        check(with_mask(dense(2, 8, 2, 1, sk, d), false, 40, 0), dt);
      }
}

TEST_F(Sm80Forward, VarlenWithEmptySequences) {
  for (DType dt : kDtypes)
    for (int d : {64, 128}) {
      check(packed(4, 2, d, {5, 0, 130, 260}, {7, 9, 0, 200}), dt);
      check(with_mask(packed(2, 2, d, {1, 300, 64, 0}, {1, 250, 300, 3}), true, -1, -1), dt);
      check(with_mask(packed(2, 1, d, {200, 17}, {180, 40}), false, 31, 5), dt);
    }
}

TEST_F(Sm80Forward, VarlenSequsedK) {
  for (DType dt : kDtypes)
    for (int d : {64, 128}) {
      Problem p = packed(4, 2, d, {5, 0, 130, 260, 1}, {7, 9, 200, 200, 3000});
      p.seqused_k = {4, 3, -1, 150, 2500};
      check(p, dt);
      check(with_mask(p, true, -1, -1), dt);
    }
}

TEST_F(Sm80Forward, BhsdLayout) {
  for (DType dt : kDtypes) check(with_mask(dense(2, 4, 2, 150, 170, 128), true, -1, -1), dt, Layout::kBHSD);
}

TEST_F(Sm80Forward, HeadDimsServedByLargerInstances) {
  for (int d : {8, 40, 56, 72, 120}) check(dense(1, 2, 2, 130, 150, d), DType::kFloat16);
  check(with_mask(dense(1, 2, 1, 130, 150, 88), true, -1, -1), DType::kBFloat16);
}

// Every kernel head dim (and one partial width below it) that this build can serve: the first
// beyond the largest compiled instance ends the test as skipped, after the smaller ones ran (so a
// small build still runs them); any other error fails it.
TEST_F(Sm80Forward, EveryHeadDim) {
  for (int d : {32, 96, 192, 256})
    for (int width : {d, d - 8})
      for (DType dt : kDtypes) {
        const Problem p = with_mask(dense(1, 2, 1, 140, 170, width), dt == DType::kBFloat16, -1, -1);
        FUSEDATTN_RUN_OR_SKIP(run_unless_missing([&] { check(p, dt); }));
      }
}

TEST_F(Sm80Forward, LargeLogitsDoNotOverflow) {
  for (DType dt : kDtypes) {
    check(dense(1, 2, 2, 200, 200, 64), dt, Layout::kBSHD, 100.0);
    check(with_mask(dense(1, 2, 2, 200, 200, 128), true, -1, -1), dt, Layout::kBSHD, 100.0);
  }
}

// Scores that rise towards the first keys, which the kernel visits last: a row's running max
// moves in most KV blocks, by less than the rescale slack in some and by far more in others, so
// both the kept (stale) reference max and the rescale of O are exercised.
TEST_F(Sm80Forward, RowMaximumRisingAcrossKeyBlocks) {
  constexpr int64_t kSq = 300, kSk = 700, kHeads = 2;
  constexpr double kQRamp = 16.0, kKRamp = 16.0;  // logits up to 256 * scale: ~46 log2 units at d64
  for (DType dt : kDtypes)
    for (int d : {64, 128})
      for (bool causal : {false, true}) {
        auto rising = [&](Tensors& t) {  // dim 0 of every q row and a ramp in dim 0 of k (BSHD)
          for (int64_t i = 0; i < kSq; ++i)
            for (int64_t h = 0; h < kHeads; ++h) t.q[(i * kHeads + h) * d] = round_to(dt, kQRamp);
          for (int64_t j = 0; j < kSk; ++j) {
            const double ramp = static_cast<double>(kSk - j) / kSk;
            for (int64_t h = 0; h < kHeads; ++h) t.k[(j * kHeads + h) * d] = round_to(dt, kKRamp * ramp * ramp);
          }
        };
        check(with_mask(dense(1, kHeads, kHeads, kSq, kSk, d), causal, -1, -1), dt, Layout::kBSHD, 1.0, rising);
      }
}

TEST_F(Sm80Forward, NegativeAndZeroScale) {
  for (float s : {-0.3f, 0.f + 1e-30f, -1e-30f}) {
    Problem p = dense(1, 2, 2, 140, 150, 64);
    p.softmax_scale = s;
    check(p, DType::kFloat16);
    check(with_mask(p, true, -1, -1), DType::kBFloat16);
  }
}

TEST_F(Sm80Forward, FullyMaskedRowsGiveZeroAndMinusInf) {
  const Problem p = with_mask(dense(1, 2, 2, 200, 60, 64), true, -1, -1);  // rows < 140 see nothing
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, DType::kFloat16, Layout::kBSHD, rng);
  run_on_gpu(c);
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  for (int64_t i = 0; i < 140; ++i)
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(lse[h * 200 + i], -INFINITY) << "row " << i;
      for (int d = 0; d < 64; ++d) ASSERT_EQ(out[(i * 2 + h) * 64 + d], 0.0) << "row " << i;
    }
}

TEST_F(Sm80Forward, NanStaysInTheRowsItReaches) {
  const Problem p = dense(1, 1, 1, 130, 130, 64);
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, DType::kFloat16, Layout::kBSHD, rng);
  constexpr int64_t kNanRow = 37;
  c.values.q[kNanRow * 64 + 5] = NAN;
  refill_inputs(c);
  run_on_gpu(c);
  const std::vector<double> out = c.out.to_double();
  for (int64_t i = 0; i < 130; ++i)
    for (int d = 0; d < 64; ++d)
      ASSERT_EQ(std::isnan(out[i * 64 + d]), i == kNanRow) << "row " << i << " dim " << d;
}

// The second problem splits its keys (fwd_kv_split.h, asserted): the combine kernel writes no LSE
// either. A call without LSE gives the kernels no LSE address, so a write of one could only go
// through the null pointer (a fault, caught at run_on_gpu's synchronisation); and out must not
// depend on it: the same call with LSE gives the same bits.
TEST_F(Sm80Forward, NullLseIsNotWritten) {
  struct Case {
    Problem p;
    bool splits;
  };
  for (const Case& k : {Case{dense(1, 2, 2, 100, 100, 64), false}, Case{dense(1, 8, 2, 1, 3000, 64), true}}) {
    const Problem& p = k.p;
    SCOPED_TRACE(p.str());
    if (k.splits) {
      EXPECT_GE(planned_kv_parts(p, DType::kBFloat16), 2) << "the launch does not split its keys";
    }
    std::mt19937_64 rng = fresh_rng();
    HostCase c = make_case(p, DType::kBFloat16, Layout::kBSHD, rng);
    run_on_gpu(c, /*with_lse=*/false);
    Tensors ref = c.values, plain = c.values;
    reference_forward(p, ref);
    plain_forward(p, DType::kBFloat16, plain);
    EXPECT_TRUE(obeys_2x_rule(c.out.to_double(), plain.out, ref.out, atol_for(DType::kBFloat16))) << p.str();
    const std::vector<unsigned char> out_without_lse = bytes_of(c.out);
    run_on_gpu(c, /*with_lse=*/true);
    EXPECT_TRUE(bytes_of(c.out) == out_without_lse) << "out differs from the call's with LSE, " << p.str();
  }
}

// Launches of few tiles over many keys under full masks split each tile's key blocks into parts
// (fwd_kv_split.h: at least kMinKeysPerPart keys a part) combined by a second kernel: decode with
// and without grouped heads, a few query rows, key counts that end inside a block, both layouts.
// Each shape is first asserted to split (its plan, computed as the launch computes it).
TEST_F(Sm80Forward, KeySplitDenseLaunches) {
  for (DType dt : kDtypes)
    for (int d : {64, 128}) {
      for (int64_t sk : {1024, 3001, 20000}) {
        check_split(dense(1, 8, 2, 1, sk, d), dt);
        check_split(with_mask(dense(2, 4, 4, 1, sk, d), true, -1, -1), dt, Layout::kBHSD);  // one row: full
      }
      check_split(dense(2, 2, 1, 5, 4500, d), dt);
      check_split(dense(1, 1, 1, 70, 7000, d), dt, Layout::kBHSD);
    }
  // On larger instances, where this build has them: the first head dim it lacks ends the test as
  // skipped (the list rises, so the rest lack one too); any other error fails it.
  for (int d : {40, 96, 256})
    FUSEDATTN_RUN_OR_SKIP(run_unless_missing([&] { check_split(dense(1, 4, 2, 1, 2600, d), DType::kFloat16); }));
}

// The parts are combined in part order, so repeated runs give the same bits; launches of other
// shapes in between grow and reuse the stream's workspace.
TEST_F(Sm80Forward, KeySplitRepeatsBitIdentical) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(dense(2, 8, 2, 1, 9000, 128), DType::kFloat16, Layout::kBSHD, rng);
  EXPECT_GE(planned_kv_parts(c.problem, DType::kFloat16), 2) << "the launch does not split its keys";
  run_on_gpu(c);
  const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
  check_split(dense(4, 32, 8, 1, 20000, 128), DType::kBFloat16);  // a larger workspace
  run_on_gpu(c);
  EXPECT_EQ(c.out.to_double(), out);
  EXPECT_EQ(c.lse.to_double(), lse);
}

// Variable-length batches split by their longest sequence: shorter ones have parts without keys,
// and a sequence with no key at all (seqused_k 0) gets 0 and -inf from every part.
TEST_F(Sm80Forward, KeySplitVarlenLaunches) {
  for (DType dt : kDtypes)
    for (int d : {64, 128}) {
      check_split(packed(8, 2, d, {1, 1, 1, 3}, {5000, 40, 2000, 0}), dt);
      Problem used = packed(4, 4, d, {1, 1, 1}, {6000, 6000, 6000});
      used.seqused_k = {5999, 0, 700};
      check_split(used, dt);
    }
}

}  // namespace
}  // namespace fusedattn::testing
