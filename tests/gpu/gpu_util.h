// Helpers for the GPU suite: device copies of HostTensors, a case mirrored on the device, the
// skip rules (no GPU; head dim not compiled in this build), fast random fills for multi-GB
// inputs, and row-sampled reference checks for problems too large for the full reference.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedattn/params.h"
#include "gpu/missing_instance.h"
#include "reference/problems.h"
#include "reference/test_util.h"

namespace fusedattn::testing {

constexpr Device kGpu{DeviceType::kCUDA, 0};
constexpr const char* kNoGpuMessage = "no CUDA GPU visible: skipping GPU tests";

// Every GPU test starts with this.
#define FUSEDATTN_REQUIRE_GPU() \
  do {                                                                      \
    if (!::fusedattn::cuda_available()) GTEST_SKIP() << ::fusedattn::testing::kNoGpuMessage; \
  } while (0)

inline void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Bytes of 0xFF are a NaN in fp16, bf16 and fp32 alike, so one memset poisons any output.
constexpr int kPoisonByte = 0xFF;

// A device allocation holding a copy of a HostTensor.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& host) : bytes_(host.nbytes()) {
    if (bytes_ > 0) cuda_check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
    upload(host);
  }
  ~DeviceTensor() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceTensor(DeviceTensor&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  // Both finish before they return, for a call on any stream after them: a copy from pageable
  // memory may return before its DMA lands, and a memset runs on the legacy stream, neither of
  // which a non-blocking stream waits for (a graph replayed on one read stale offsets so).
  void upload(const HostTensor& host) {
    if (bytes_ == 0) return;
    cuda_check(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
    cuda_check(cudaDeviceSynchronize(), "upload");
  }
  void download(HostTensor& host) const {
    if (bytes_ > 0) cuda_check(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "download");
  }
  void poison() {
    if (bytes_ == 0) return;
    cuda_check(cudaMemset(ptr_, kPoisonByte, bytes_), "poison");
    cuda_check(cudaDeviceSynchronize(), "poison");
  }
  void* data() const { return ptr_; }
  TensorView view(const HostTensor& like) const { return like.view_at(ptr_, kGpu); }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// A HostCase mirrored on the device; results come back into the host tensors.
struct DeviceCase {
  HostCase& host;
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv, cu_q, cu_k, used_k;

  explicit DeviceCase(HostCase& c)
      : host(c), q(c.q), k(c.k), v(c.v), out(c.out), lse(c.lse), dout(c.dout), dq(c.dq), dk(c.dk), dv(c.dv) {
    if (c.problem.varlen()) {
      cu_q = DeviceTensor(c.cu_q);
      cu_k = DeviceTensor(c.cu_k);
      if (!c.problem.seqused_k.empty()) used_k = DeviceTensor(c.used_k);
    }
  }

  Options options() const {
    const Problem& p = host.problem;
    if (!p.varlen()) return options_for(p);
    return options_for(p, cu_q.view(host.cu_q), cu_k.view(host.cu_k),
                       p.seqused_k.empty() ? TensorView{} : used_k.view(host.used_k));
  }
  ForwardArgs forward_args() const {
    ForwardArgs a;
    a.q = q.view(host.q);
    a.k = k.view(host.k);
    a.v = v.view(host.v);
    a.out = out.view(host.out);
    a.lse = lse.view(host.lse);
    a.options = options();
    return a;
  }
  BackwardArgs backward_args() const {
    BackwardArgs a;
    a.dout = dout.view(host.dout);
    a.q = q.view(host.q);
    a.k = k.view(host.k);
    a.v = v.view(host.v);
    a.out = out.view(host.out);
    a.lse = lse.view(host.lse);
    a.dq = dq.view(host.dq);
    a.dk = dk.view(host.dk);
    a.dv = dv.view(host.dv);
    a.options = options();
    return a;
  }

  // Poisons out/lse, runs the forward, waits, copies out/lse back to the host tensors.
  SkipReason forward(const ForwardArgs& args) {
    out.poison();
    lse.poison();
    const SkipReason skip = run_unless_missing([&] { fusedattn::forward(args); });
    if (skip) return skip;
    cuda_check(cudaDeviceSynchronize(), "forward");
    out.download(host.out);
    lse.download(host.lse);
    return std::nullopt;
  }
  SkipReason forward() { return forward(forward_args()); }

  // Poisons the gradients, runs the backward (on the device's out/lse), copies them back.
  SkipReason backward(const BackwardArgs& args) {
    dq.poison();
    dk.poison();
    dv.poison();
    const SkipReason skip = run_unless_missing([&] { fusedattn::backward(args); });
    if (skip) return skip;
    cuda_check(cudaDeviceSynchronize(), "backward");
    dq.download(host.dq);
    dk.download(host.dk);
    dv.download(host.dv);
    return std::nullopt;
  }
  SkipReason backward(bool deterministic = false) {
    BackwardArgs a = backward_args();
    a.deterministic = deterministic;
    return backward(a);
  }
};

// `call` captured into a CUDA graph on `stream` (global mode) and instantiated, for a test to
// replay. Work a call puts on another stream (the legacy one included) is not in the graph: it
// fails under the capture, or ran at once, before the graph, so that the graph lacks its kernels
// and the results it leaves are not the replay's. The capture ends whatever `call` does (else the
// stream would stay captured); an error it throws is rethrown then (a missing instance: wrap the
// call in run_unless_missing). Only calls that read nothing on the host may be captured (dense
// forwards, merges, calls with their lengths on the device: docs/api.md).
class CapturedGraph {
 public:
  template <typename Fn>
  CapturedGraph(cudaStream_t stream, Fn&& call) : stream_(stream) {
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    std::exception_ptr error;
    try {
      call();
    } catch (...) {
      error = std::current_exception();
    }
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph_);
    if (error) std::rethrow_exception(error);
    cuda_check(ended, "end capture");
    cuda_check(cudaGraphInstantiate(&exec_, graph_, 0), "instantiate");
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }

  cudaGraph_t graph() const { return graph_; }

  // The graph's kernel nodes.
  int kernels() const {
    std::size_t count = 0;
    cuda_check(cudaGraphGetNodes(graph_, nullptr, &count), "graph nodes");
    std::vector<cudaGraphNode_t> nodes(count);
    cuda_check(cudaGraphGetNodes(graph_, nodes.data(), &count), "graph nodes");
    int kernels = 0;
    for (std::size_t i = 0; i < count; ++i) {
      cudaGraphNodeType type{};
      cuda_check(cudaGraphNodeGetType(nodes[i], &type), "graph node type");
      kernels += type == cudaGraphNodeTypeKernel;
    }
    return kernels;
  }

  // Launches the graph on its stream and waits for it.
  void replay() const {
    cuda_check(cudaGraphLaunch(exec_, stream_), "graph launch");
    cuda_check(cudaStreamSynchronize(stream_), "graph replay");
  }

 private:
  cudaStream_t stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Runs `call` captured into a CUDA graph on `stream` (CapturedGraph), replays it once and waits
// for it; returns the graph's kernel nodes.
template <typename Fn>
int run_captured(cudaStream_t stream, Fn&& call) {
  const CapturedGraph g(stream, std::forward<Fn>(call));
  g.replay();
  return g.kernels();
}

// SMs of device 0: what the launchers' tail-split plans divide the work by.
inline int sm_count() {
  int n = 0;
  cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0), "sm count");
  return n;
}

// Runs the forward of `p` `runs` times on the same fresh random inputs (outputs poisoned before
// each run) and expects out and lse bit-identical to the first run's. A skip reason when the build
// lacks the head dim.
inline SkipReason expect_bit_identical_forwards(const Problem& p, DType dtype, int runs) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
  DeviceCase dc(c);
  std::vector<unsigned char> out0, lse0;
  for (int run = 0; run < runs; ++run) {
    if (SkipReason why = dc.forward()) return why;
    if (run == 0) {
      out0 = bytes_of(dc.host.out);
      lse0 = bytes_of(dc.host.lse);
    } else {
      EXPECT_EQ(bytes_of(dc.host.out), out0) << "out differs on run " << run;
      EXPECT_EQ(bytes_of(dc.host.lse), lse0) << "lse differs on run " << run;
    }
  }
  return std::nullopt;
}

// True on an sm_90 GPU (the Hopper kernels' tests).
inline bool on_hopper() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  return prop.major == 9 && prop.minor == 0;
}

#define SKIP_UNLESS_HOPPER() \
  if (!::fusedattn::testing::on_hopper()) GTEST_SKIP() << "needs an sm_90 GPU"

// ---- inputs too large for the double-valued path --------------------------------------------

// Fills a 16-bit tensor with i.i.d. uniform values of unit variance at memory speed: a table of
// the 2^16 encodings indexed by random 16-bit draws (each 64-bit draw gives four).
inline void fill_uniform_fast(HostTensor& t, std::mt19937_64& rng) {
  constexpr int kTableSize = 1 << 16;
  constexpr double kHalfWidth = 1.7320508075688772;  // sqrt(3): unit variance
  constexpr int kDrawsPerWord = 4, kBitsPerDraw = 16;
  if (dtype_size(t.dtype()) != 2) throw std::invalid_argument("fill_uniform_fast: 16-bit dtypes only");
  std::vector<uint16_t> table(kTableSize);
  for (int u = 0; u < kTableSize; ++u) {
    const double x = ((u + 0.5) / kTableSize * 2.0 - 1.0) * kHalfWidth;
    encode(t.dtype(), &x, &table[u], 1);
  }
  auto* dst = static_cast<uint16_t*>(t.data());
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i += kDrawsPerWord) {
    uint64_t word = rng();
    for (int k = 0; k < kDrawsPerWord && i + k < n; ++k, word >>= kBitsPerDraw) dst[i + k] = table[word & 0xFFFF];
  }
}

// Reads elements (b, s, h, d) of a dense host tensor through its view's strides.
class DenseReader {
 public:
  explicit DenseReader(const HostTensor& t)
      : base_(static_cast<const unsigned char*>(t.data())), dtype_(t.dtype()), elem_(dtype_size(t.dtype())) {
    const TensorView v = t.view_at(const_cast<void*>(t.data()), Device{});
    for (int d = 0; d < v.rank; ++d) stride_[d] = v.stride[d];
  }
  double operator()(int64_t b, int64_t s, int64_t h, int64_t d) const {
    double x;
    decode(dtype_, base_ + (b * stride_[0] + s * stride_[1] + h * stride_[2] + d) * elem_, &x, 1);
    return x;
  }

 private:
  const unsigned char* base_;
  DType dtype_;
  std::size_t elem_;
  int64_t stride_[kMaxRank] = {};
};

struct SampledRow {
  int b, h;
  int64_t i;
};

// `count` random rows of a dense problem plus its first and last rows (and the last row of the
// last head, where element offsets are largest).
inline std::vector<SampledRow> sample_rows(const Problem& p, std::mt19937_64& rng, int count) {
  std::uniform_int_distribution<int> pick_b(0, p.batch - 1), pick_h(0, p.heads_q - 1);
  std::uniform_int_distribution<int64_t> pick_i(0, p.seqlen_q - 1);
  std::vector<SampledRow> rows{{0, 0, 0}, {p.batch - 1, p.heads_q - 1, p.seqlen_q - 1}, {p.batch - 1, p.heads_q - 1, 0}};
  while (rows.size() < static_cast<size_t>(count)) rows.push_back({pick_b(rng), pick_h(rng), pick_i(rng)});
  std::sort(rows.begin(), rows.end(), [](const SampledRow& a, const SampledRow& b) {
    return std::tie(a.b, a.h, a.i) < std::tie(b.b, b.h, b.i);
  });
  return rows;
}

// Sampled rows of a dense forward: the backend's out/lse next to the float64 reference's and
// the plain implementation's, as flat vectors for the 2x rule or an atol/rtol check.
struct SampledForward {
  std::vector<double> got_out, ref_out, plain_out, got_lse, ref_lse, plain_lse;
};

// Each (batch, head) is reduced to a one-head problem with the same lengths and mask, so only
// that head's q and its KV head's k and v are decoded.
inline SampledForward sample_forward(const Problem& p, DType dtype, const HostTensor& q, const HostTensor& k,
                                     const HostTensor& v, const HostTensor& out, const HostTensor& lse,
                                     const std::vector<SampledRow>& rows) {
  Problem one = p;
  one.batch = 1;
  one.heads_q = 1;
  one.heads_kv = 1;
  const int D = p.head_dim;
  const int group = p.heads_q / p.heads_kv;
  SampledForward r;
  const DenseReader read_q(q), read_k(k), read_v(v), read_out(out);
  const TensorView lse_view = lse.view_at(const_cast<void*>(lse.data()), Device{});
  const auto* lse_data = static_cast<const float*>(lse.data());
  Tensors t;
  int loaded_b = -1, loaded_h = -1, loaded_kv = -1;
  for (const SampledRow& row : rows) {
    const int hk = row.h / group;
    if (row.b != loaded_b || hk != loaded_kv) {
      t.k.assign(static_cast<size_t>(p.seqlen_k) * D, 0.0);
      t.v.assign(t.k.size(), 0.0);
      for (int64_t s = 0; s < p.seqlen_k; ++s)
        for (int d = 0; d < D; ++d) {
          t.k[s * D + d] = read_k(row.b, s, hk, d);
          t.v[s * D + d] = read_v(row.b, s, hk, d);
        }
      loaded_kv = hk;
    }
    if (row.b != loaded_b || row.h != loaded_h) t.q.assign(static_cast<size_t>(p.seqlen_q) * D, 0.0);
    loaded_b = row.b;
    loaded_h = row.h;
    for (int d = 0; d < D; ++d) t.q[row.i * D + d] = read_q(row.b, row.i, row.h, d);
    const RowResult want = reference_forward_row(one, t, 0, 0, row.i);
    const RowResult plain = plain_forward_row(one, dtype, t, 0, 0, row.i);
    for (int d = 0; d < D; ++d) r.got_out.push_back(read_out(row.b, row.i, row.h, d));
    r.ref_out.insert(r.ref_out.end(), want.out.begin(), want.out.end());
    r.plain_out.insert(r.plain_out.end(), plain.out.begin(), plain.out.end());
    r.got_lse.push_back(lse_data[row.b * lse_view.stride[0] + row.h * lse_view.stride[1] + row.i]);
    r.ref_lse.push_back(want.lse);
    r.plain_lse.push_back(plain.lse);
  }
  return r;
}

// One (batch, head) of a dense multi-head (not grouped) problem as a one-head problem: its inputs
// in t, for reference_backward; and the backend's gradients of that head.
struct HeadSlice {
  Problem problem;
  Tensors t;
  std::vector<double> got_dq, got_dk, got_dv;
};

// The rows of (batch b, head h) of a dense [B, S, H, D] host tensor, as a one-head [S, D] block.
inline std::vector<double> head_rows(const HostTensor& t, int64_t rows, int head_dim, int b, int h) {
  const DenseReader read(t);
  std::vector<double> dst(static_cast<size_t>(rows) * head_dim);
  for (int64_t i = 0; i < rows; ++i)
    for (int d = 0; d < head_dim; ++d) dst[i * head_dim + d] = read(b, i, h, d);
  return dst;
}

inline HeadSlice slice_head(const HostCase& c, int b, int h) {
  const Problem& p = c.problem;
  if (p.heads_q != p.heads_kv || p.varlen()) throw std::invalid_argument("slice_head: dense MHA problems only");
  HeadSlice s;
  s.problem = p;
  s.problem.batch = 1;
  s.problem.heads_q = s.problem.heads_kv = 1;
  const int D = p.head_dim;
  s.t.q = head_rows(c.q, p.seqlen_q, D, b, h);
  s.t.k = head_rows(c.k, p.seqlen_k, D, b, h);
  s.t.v = head_rows(c.v, p.seqlen_k, D, b, h);
  s.t.dout = head_rows(c.dout, p.seqlen_q, D, b, h);
  s.got_dq = head_rows(c.dq, p.seqlen_q, D, b, h);
  s.got_dk = head_rows(c.dk, p.seqlen_k, D, b, h);
  s.got_dv = head_rows(c.dv, p.seqlen_k, D, b, h);
  return s;
}

}  // namespace fusedattn::testing
