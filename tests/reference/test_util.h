// GoogleTest helpers shared by the CPU and GPU suites: reproducible fresh inputs per check, host
// tensors for one problem, and ForwardArgs/BackwardArgs built from them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "reference/reference.h"

namespace fusedattn::testing {

// A generator seeded from the running test's full name and a per-test counter: every call gives
// different inputs (fresh per check), and a rerun of the same test sees the same sequence. The
// environment variable FUSEDATTN_TEST_SEED (any text, as in the Python tests' conftest.py) is
// appended to the name, so the same suite can run again on other inputs; unset, nothing changes.
inline std::mt19937_64 fresh_rng() {
  constexpr uint64_t kFnvOffset = 14695981039346656037ull;
  constexpr uint64_t kFnvPrime = 1099511628211ull;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const char* salt = std::getenv("FUSEDATTN_TEST_SEED");
  const std::string name =
      (info ? std::string(info->test_suite_name()) + "." + info->name() : "no-test") + (salt ? salt : "");
  static std::map<std::string, uint64_t> counters;
  uint64_t h = kFnvOffset;  // FNV-1a: stable across compilers, unlike std::hash
  for (unsigned char c : name) h = (h ^ c) * kFnvPrime;
  return std::mt19937_64(h + counters[name]++);
}

// Standard deviation of the inputs unless a test says otherwise.
constexpr double kDefaultStddev = 1.0;

// Host tensors of one problem in one dtype and layout, plus their values in double.
struct HostCase {
  Problem problem;
  DType dtype = DType::kFloat16;
  Layout layout = Layout::kBSHD;
  Tensors values;  // inputs as rounded to dtype (q, k, v, dout), canonical order
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  HostTensor cu_q, cu_k;  // int32 offsets, varlen only
  HostTensor used_k;      // int32 seqused_k, where the problem gives it
};

inline std::vector<int64_t> q_shape(const Problem& p) {
  if (p.varlen()) return {p.total_q(), p.heads_q, p.head_dim};
  return {p.batch, p.seqlen_q, p.heads_q, p.head_dim};
}
inline std::vector<int64_t> k_shape(const Problem& p) {
  if (p.varlen()) return {p.total_k(), p.heads_kv, p.head_dim};
  return {p.batch, p.seqlen_k, p.heads_kv, p.head_dim};
}
inline std::vector<int64_t> lse_shape(const Problem& p) {
  if (p.varlen()) return {p.heads_q, p.total_q()};
  return {p.batch, p.heads_q, p.seqlen_q};
}

inline int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// Fresh N(0, stddev) q, k, v, dout rounded to dtype; out, lse and the gradients poisoned.
// Forward-only callers of large problems may pass with_backward = false to skip dout and the
// gradient tensors (backward_args then must not be used).
inline HostCase make_case(const Problem& p, DType dtype, Layout layout, std::mt19937_64& rng,
                          double stddev = kDefaultStddev, bool with_backward = true) {
  HostCase c;
  c.problem = p;
  c.dtype = dtype;
  c.layout = p.varlen() ? Layout::kBSHD : layout;  // packed tensors have one layout only
  const auto qs = q_shape(p), ks = k_shape(p);
  c.q = HostTensor(dtype, qs, c.layout);
  c.k = HostTensor(dtype, ks, c.layout);
  c.v = HostTensor(dtype, ks, c.layout);
  c.out = HostTensor(dtype, qs, c.layout);
  c.lse = HostTensor(DType::kFloat32, lse_shape(p));
  c.values.q = randn(rng, product(qs), stddev, dtype);
  c.values.k = randn(rng, product(ks), stddev, dtype);
  c.values.v = randn(rng, product(ks), stddev, dtype);
  c.q.fill(c.values.q);
  c.k.fill(c.values.k);
  c.v.fill(c.values.v);
  c.out.poison();
  c.lse.poison();
  if (with_backward) {
    c.dout = HostTensor(dtype, qs, c.layout);
    c.dq = HostTensor(dtype, qs, c.layout);
    c.dk = HostTensor(dtype, ks, c.layout);
    c.dv = HostTensor(dtype, ks, c.layout);
    c.values.dout = randn(rng, product(qs), stddev, dtype);
    c.dout.fill(c.values.dout);
    for (HostTensor* t : {&c.dq, &c.dk, &c.dv}) t->poison();
  }
  if (p.varlen()) {
    const int64_t entries = int64_t{p.batch} + 1;
    c.cu_q = HostTensor(DType::kInt32, {entries});
    c.cu_k = HostTensor(DType::kInt32, {entries});
    const auto cq = p.cu_seqlens_q(), ck = p.cu_seqlens_k();
    c.cu_q.fill(std::vector<double>(cq.begin(), cq.end()));
    c.cu_k.fill(std::vector<double>(ck.begin(), ck.end()));
    if (!p.seqused_k.empty()) {
      c.used_k = HostTensor(DType::kInt32, {p.batch});
      c.used_k.fill(std::vector<double>(p.seqused_k.begin(), p.seqused_k.end()));
    }
  }
  return c;
}

// A tensor's bytes, for bit-identity checks across runs.
inline std::vector<unsigned char> bytes_of(const HostTensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.data());
  return {p, p + t.nbytes()};
}

// Re-encodes c.values' inputs into the host tensors (after a test edits them, e.g. adds a NaN).
inline void refill_inputs(HostCase& c) {
  c.q.fill(c.values.q);
  c.k.fill(c.values.k);
  c.v.fill(c.values.v);
  if (!c.values.dout.empty()) c.dout.fill(c.values.dout);
}

// Options for a problem; cu_q/cu_k are the offset tensors' views (empty for dense problems),
// used_k seqused_k's (empty where the problem has none).
inline Options options_for(const Problem& p, TensorView cu_q = {}, TensorView cu_k = {}, TensorView used_k = {}) {
  Options o;
  if (p.softmax_scale != 0.f) o.softmax_scale = p.softmax_scale;
  o.causal = p.causal;
  o.window_left = p.window_left;
  o.window_right = p.window_right;
  if (p.varlen()) {
    o.cu_seqlens_q = cu_q;
    o.cu_seqlens_k = cu_k;
    o.seqused_k = used_k;
    o.max_seqlen_q = std::max(p.max_seqlen_q(), p.max_seqlen_bound);
    o.max_seqlen_k = std::max(p.max_seqlen_k(), p.max_seqlen_bound);
  }
  return o;
}

inline ForwardArgs forward_args(HostCase& c) {
  ForwardArgs a;
  a.q = c.q.view();
  a.k = c.k.view();
  a.v = c.v.view();
  a.out = c.out.view();
  a.lse = c.lse.view();
  a.options = c.problem.varlen() ? options_for(c.problem, c.cu_q.view(), c.cu_k.view(),
                                               c.problem.seqused_k.empty() ? TensorView{} : c.used_k.view())
                                 : options_for(c.problem);
  return a;
}

// The backward of a forward call: its inputs, out, lse and options; the gradients left empty.
inline BackwardArgs backward_args_of(const ForwardArgs& f) {
  BackwardArgs a;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  a.out = f.out;
  a.lse = f.lse;
  a.options = f.options;
  return a;
}

// Backward args; out and lse are whatever c.out / c.lse hold (run the forward first).
inline BackwardArgs backward_args(HostCase& c) {
  BackwardArgs a = backward_args_of(forward_args(c));
  a.dout = c.dout.view();
  a.dq = c.dq.view();
  a.dk = c.dk.view();
  a.dv = c.dv.view();
  return a;
}

// A view of `shape` with explicit strides over `base`'s bytes, starting `first` elements in: for
// packed QKV buffers and padded outputs. `data` replaces the base pointer (a device copy).
inline TensorView strided_view(HostTensor& base, int64_t first, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> stride, void* data = nullptr, Device device = {}) {
  TensorView t;
  t.data = static_cast<unsigned char*>(data ? data : base.data()) + first * static_cast<int64_t>(dtype_size(base.dtype()));
  t.dtype = base.dtype();
  t.device = device;
  t.rank = static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) t.shape[d++] = s;
  d = 0;
  for (int64_t s : stride) t.stride[d++] = s;
  return t;
}

// The elements of a host [B, S, H, D] view (any strides) in canonical order.
inline std::vector<double> gather_dense(const TensorView& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t s = 0; s < t.shape[1]; ++s)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t d = 0; d < t.shape[3]; ++d) {
          double x;
          const int64_t off = b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d;
          decode(t.dtype, static_cast<const unsigned char*>(t.data) + off * elem, &x, 1);
          out.push_back(x);
        }
  return out;
}

// Runs fn and returns the fusedattn::Error it throws; fails the test when it throws nothing.
template <typename Fn>
std::optional<Error> error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a fusedattn::Error, nothing was thrown";
  return std::nullopt;
}

// Expects call to throw a fusedattn::Error with `code`, naming `argument`, whose message mentions
// `mentions` (what is accepted).
inline void expect_error(const std::function<void()>& call, ErrorCode code, const std::string& argument,
                         const std::string& mentions) {
  const std::optional<Error> e = error_of(call);
  if (!e) return;
  EXPECT_EQ(e->code(), code) << error_code_name(e->code()) << ": " << e->what();
  EXPECT_EQ(e->argument(), argument) << e->what();
  EXPECT_NE(std::string(e->what()).find(mentions), std::string::npos)
      << "message \"" << e->what() << "\" should mention \"" << mentions << "\"";
}

// |got - ref| <= atol + rtol |ref| everywhere (NaN/Inf must match exactly); returns a gtest result
// naming the worst position.
inline ::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& ref,
                                            double atol, double rtol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs reference " << ref.size();
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (!std::isfinite(a) || !std::isfinite(b)) {
      const bool same = (std::isnan(a) && std::isnan(b)) || a == b;
      if (!same) {
        ++bad;
        if (worst_excess != INFINITY) worst = static_cast<int64_t>(i);
        worst_excess = INFINITY;
      }
      continue;
    }
    const double excess = std::fabs(a - b) - (atol + rtol * std::fabs(b));
    if (excess > 0) {
      ++bad;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " values outside atol " << atol
                                       << " + rtol " << rtol << "; worst at " << worst << ": got " << got[worst]
                                       << ", reference " << ref[worst];
}

// fp16/bf16: the 2x rule's absolute slack, one storage ulp near 1 (so that a result that is
// exact up to its final rounding always passes, even where the plain error happens to be 0).
constexpr double kFp16Atol = 1e-3;
constexpr double kBf16Atol = 8e-3;
inline double atol_for(DType dtype) { return dtype == DType::kBFloat16 ? kBf16Atol : kFp16Atol; }

// The 2x rule as a gtest assertion.
inline ::testing::AssertionResult obeys_2x_rule(const std::vector<double>& got, const std::vector<double>& plain,
                                                const std::vector<double>& ref, double atol) {
  std::string message;
  if (within_2x_rule(got, plain, ref, atol, &message)) return ::testing::AssertionSuccess() << message;
  return ::testing::AssertionFailure() << message;
}

// c's key gradients after a backward without query rows: 0, since no query attends to a key (they
// hold the poison before each run). A no-op once left them unwritten: NaN in the tests, in the
// binding whatever torch.empty_like held, summed into k.grad.
inline void expect_zero_key_gradients(const HostCase& c) {
  for (double x : c.dk.to_double()) ASSERT_EQ(x, 0.0) << "dk";
  for (double x : c.dv.to_double()) ASSERT_EQ(x, 0.0) << "dv";
}

}  // namespace fusedattn::testing
