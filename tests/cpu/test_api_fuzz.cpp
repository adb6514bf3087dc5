// Random calls of forward(), backward(), merge_attention() and append_kv() on host tensors, most
// of them invalid in one or more ways (sizes, strides, dtypes, windows, scales, offsets, tables,
// column masks, backends): each must either run or throw fusedattn::Error; any other exception
// fails the test. A call whose written tensor was placed over another tensor's memory must not
// run (unless it has nothing to write). A read or write outside a view's buffer, undefined behaviour or two threads
// writing one address is what the sanitized builds of this suite catch (scripts/test_sanitize.sh;
// docs/api.md's rules are what it probes).
// Every view is backed by a buffer that holds all of its elements, so a call that passes
// validation may run; a view no buffer could back (a huge size) gets no data, so validation must
// turn it down.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "fusedattn/attention.h"
#include "fusedattn/kv_cache.h"
#include "fusedattn/merge.h"
#include "api/validate.h"
#include "reference/test_util.h"

namespace fusedattn::testing {
namespace {

constexpr int kCalls = 2000;
constexpr int64_t kHugeSize = int64_t{1} << 40;
constexpr int64_t kMaxBackedElements = int64_t{1} << 22;
constexpr int kPercent = 100;
constexpr int kMinRunShare = 50;  // at least 1 in 50 calls must pass validation and run
constexpr int kMinComputeShare = 100;  // attention: at least 1 in 100 must reach the backend
constexpr int kBackwardShare = 100;  // percent of the calls with a backward call beside

// A view's largest element offset, where every dimension longer than one has a stride >= 0 and a
// size a buffer could hold (else none: no buffer backs the view from its data pointer on).
std::optional<int64_t> last_offset(const TensorView& t) {
  int64_t last = 0;
  for (int d = 0; d < std::min(t.rank, kMaxRank); ++d) {
    if (t.shape[d] <= 1) continue;
    if (t.stride[d] < 0 || t.shape[d] > kMaxBackedElements) return std::nullopt;
    last += (t.shape[d] - 1) * t.stride[d];
  }
  return last;
}

class Fuzzer {
 public:
  explicit Fuzzer(std::mt19937_64& rng) : rng_(rng) {}

  template <typename T>
  T pick(std::initializer_list<T> values) {
    return *(values.begin() + rng_() % values.size());
  }
  bool chance(int percent) { return static_cast<int>(rng_() % kPercent) < percent; }

  // A view of `shape` in its contiguous layout (BHSD-style swapped middle strides at times), one
  // stride or size perhaps broken, on a buffer of random bytes that holds every element.
  TensorView view(DType dtype, std::vector<int64_t> shape, bool break_one) {
    TensorView t;
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    int64_t stride = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.shape[d] = shape[d];
      t.stride[d] = stride;
      stride *= std::max<int64_t>(shape[d], 1);
    }
    if (t.rank == kMaxRank && chance(30)) std::swap(t.stride[1], t.stride[2]);
    if (break_one) {
      const int d = static_cast<int>(rng_() % t.rank);
      t.stride[d] = pick<int64_t>({0, -1, 2, 3, 7, 1024});
      if (chance(10)) t.shape[d] = pick<int64_t>({-1, 0, kHugeSize});
      if (chance(5)) t.rank = pick({-1, 0, 1, 5, 9});
    }
    const std::optional<int64_t> last = last_offset(t);
    const bool backed = last && *last < kMaxBackedElements;
    const std::size_t words = backed ? ceil_words(static_cast<std::size_t>(*last + 1) * dtype_size(dtype)) : 1;
    auto& buffer = buffers_.emplace_back(words);
    for (uint64_t& w : buffer) w = rng_();  // any bits: NaN and inf included
    // Unbacked views, and a few others, have no data: validation must say so (or find the view
    // empty) before anything is read.
    t.data = backed && !chance(3) ? buffer.data() : nullptr;
    return t;
  }

  // Random entries in [0, bound) of an int32 [rows, cols] view (with `stray`, some outside it), in
  // place of its random bits, so that paged calls also pass validation and run.
  void fill_entries(const TensorView& t, int32_t bound, bool stray) {
    if (t.data == nullptr || t.dtype != DType::kInt32 || t.rank != 2) return;
    for (int64_t r = 0; r < t.shape[0]; ++r)
      for (int64_t c = 0; c < t.shape[1]; ++c) {
        if (t.stride[0] < 0 || t.stride[1] < 0) return;
        const int32_t entry = bound > 0 ? static_cast<int32_t>(rng_() % bound) : 0;
        static_cast<int32_t*>(t.data)[r * t.stride[0] + c * t.stride[1]] = stray && chance(20) ? pick({-1, bound}) : entry;
      }
  }

  // The buffers of the previous call go.
  void next_call() { buffers_.clear(); }

  TensorView offsets(std::vector<int32_t>& values) {
    TensorView t;
    t.data = values.data();
    t.dtype = chance(95) ? DType::kInt32 : DType::kFloat32;
    t.rank = 1;
    t.shape[0] = static_cast<int64_t>(values.size());
    t.stride[0] = 1;
    return t;
  }

 private:
  static std::size_t ceil_words(std::size_t bytes) { return (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t); }

  std::mt19937_64& rng_;
  std::vector<std::vector<uint64_t>> buffers_;
};

// One call's arguments: a dense or variable-length problem, each part perhaps broken; at times a
// written tensor placed over the memory of another tensor of the call.
struct Call {
  ForwardArgs fwd;
  std::optional<BackwardArgs> bwd;
  std::vector<int32_t> cu_q, cu_k;
  bool fwd_aliased = false, bwd_aliased = false;
};

// The bytes from a view's data pointer to the end of its last element; 0 where it has no element,
// no data or no buffer could back it (last_offset).
int64_t extent_bytes(const TensorView& t) {
  if (t.data == nullptr || t.rank < 1 || t.rank > kMaxRank) return 0;
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] < 1) return 0;
  const std::optional<int64_t> last = last_offset(t);
  return last ? (*last + 1) * static_cast<int64_t>(dtype_size(t.dtype)) : 0;
}

// Points one of `written` at the data of one of `others` (another written tensor or one the call
// reads), where that buffer holds the whole written view, so that a call validation wrongly let
// through would stay inside the buffers. Returns whether it did.
bool alias_one(Fuzzer& f, std::initializer_list<TensorView*> written, std::initializer_list<TensorView*> others) {
  TensorView* w = f.pick(written);
  TensorView* o = f.pick(others);
  if (w == o || extent_bytes(*w) == 0 || extent_bytes(*o) < extent_bytes(*w)) return false;
  w->data = o->data;
  return true;
}

void fill(Fuzzer& f, Call& c) {
  const DType dtype = f.pick({DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat32,
                              DType::kFloat8E4M3, DType::kInt32});
  const int64_t batch = f.pick<int64_t>({0, 1, 2, 3}), hq = f.pick<int64_t>({0, 1, 2, 4, 6});
  const int64_t hkv = f.pick<int64_t>({0, 1, 2, 3}), d = f.pick<int64_t>({0, 1, 7, 8, 16, 64, 257});
  const int64_t sq = f.pick<int64_t>({0, 1, 2, 5, 17, 64, 130}), sk = f.pick<int64_t>({0, 1, 3, 16, 70, 129});
  const bool broken = f.chance(30);
  const auto maybe = [&](int percent) { return broken && f.chance(percent); };
  ForwardArgs& a = c.fwd;
  Options& o = a.options;
  int64_t rows_q = sq, rows_k = sk;
  if (f.chance(25)) {  // variable-length
    c.cu_q = {0};
    c.cu_k = {0};
    for (int64_t b = 0; b < batch; ++b) {
      c.cu_q.push_back(c.cu_q.back() + f.pick({0, 1, 5, 40}));
      c.cu_k.push_back(c.cu_k.back() + f.pick({0, 2, 33}));
    }
    int64_t max_q = 0, max_k = 0;
    for (std::size_t b = 1; b < c.cu_q.size(); ++b) max_q = std::max<int64_t>(max_q, c.cu_q[b] - c.cu_q[b - 1]);
    for (std::size_t b = 1; b < c.cu_k.size(); ++b) max_k = std::max<int64_t>(max_k, c.cu_k[b] - c.cu_k[b - 1]);
    rows_q = c.cu_q.back() + (maybe(30) ? f.pick<int64_t>({-1, 3}) : 0);
    rows_k = c.cu_k.back() + (maybe(30) ? f.pick<int64_t>({-1, 5}) : 0);
    if (maybe(40)) c.cu_q[f.pick<std::size_t>({0, c.cu_q.size() - 1})] += f.pick({-3, 1, 1000, -1000000});
    if (maybe(20)) c.cu_k[c.cu_k.size() / 2] += f.pick({-3, 1, 1000});
    o.cu_seqlens_q = f.offsets(c.cu_q);
    o.cu_seqlens_k = f.offsets(c.cu_k);
    if (maybe(10)) o.cu_seqlens_k.shape[0] -= 1;
    o.max_seqlen_q = max_q + (maybe(30) ? f.pick<int64_t>({-1, 5, -1000}) : 0);
    o.max_seqlen_k = max_k + (maybe(20) ? f.pick<int64_t>({-1, 7}) : 0);
    if (f.chance(20)) {
      o.checked_rows_q = maybe(50) ? f.pick<int64_t>({0, 5, 1000}) : c.cu_q.back();
      o.checked_rows_k = maybe(50) ? f.pick<int64_t>({0, 5, 1000}) : c.cu_k.back();
    }
    a.q = f.view(dtype, {rows_q, hq, d}, maybe(40));
    if (f.chance(30)) {  // paged K/V: pages of any size, a table of entries mostly in range
      const int64_t pages = maybe(30) ? f.pick<int64_t>({0, 1, 2}) : f.pick<int64_t>({5, 40});
      const int64_t page = maybe(30) ? f.pick<int64_t>({0, 1}) : f.pick<int64_t>({3, 16, 128});
      a.k = f.view(dtype, {pages, page, hkv, d}, maybe(30));
      a.v = f.view(dtype, {pages, maybe(10) ? page + 1 : page, hkv, d}, maybe(30));
      o.block_table = f.view(maybe(10) ? DType::kFloat32 : DType::kInt32,
                             {maybe(10) ? batch + 1 : batch, maybe(30) ? f.pick<int64_t>({0, 1, 2}) : 40}, maybe(30));
      f.fill_entries(o.block_table, static_cast<int32_t>(pages), maybe(30));
    } else {
      a.k = f.view(dtype, {rows_k, hkv, d}, maybe(40));
      a.v = f.view(dtype, {rows_k, hkv, d}, maybe(40));
    }
    a.out = f.view(dtype, {rows_q, hq, d}, maybe(40));
    if (f.chance(70)) a.lse = f.view(DType::kFloat32, {hq, rows_q}, maybe(30));
  } else {
    a.q = f.view(dtype, {batch, sq, hq, d}, maybe(40));
    a.k = f.view(maybe(10) ? DType::kFloat16 : dtype, {maybe(5) ? batch + 1 : batch, sk, hkv, maybe(5) ? d + 8 : d},
                 maybe(40));
    a.v = f.view(dtype, {batch, sk, hkv, d}, maybe(40));
    a.out = f.view(dtype, {batch, sq, hq, d}, maybe(40));
    if (f.chance(70)) a.lse = f.view(DType::kFloat32, {batch, hq, maybe(10) ? sq + 1 : sq}, maybe(30));
  }
  if (f.chance(20)) {  // a column mask: any int32 bounds are valid, so most of these run
    const int64_t heads = maybe(20) ? hq + 1 : f.pick<int64_t>({1, hq});
    o.column_mask = f.view(maybe(10) ? DType::kFloat32 : DType::kInt32,
                           {batch, heads, maybe(10) ? sk + 1 : sk, maybe(10) ? 3 : f.pick<int64_t>({2, 4})}, maybe(30));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  o.causal = f.chance(40);
  o.window_left = f.pick<int64_t>({-1, -1, -2, 0, 1, 3, 64, 1000, kMax, kMin});
  o.window_right = f.pick<int64_t>({-1, -1, 0, 0, 2, 100, kMax, -7});
  if (f.chance(30)) o.softmax_scale = f.pick({0.f, 1.f, -1.f, 1e6f, std::numeric_limits<float>::quiet_NaN(),
                                              std::numeric_limits<float>::infinity()});
  o.backend = f.pick({Backend::kAuto, Backend::kAuto, Backend::kCPU, Backend::kCUDA});
  o.num_threads = f.pick({0, 1, 2, -1, 1000});
  if (f.chance(kBackwardShare)) {
    BackwardArgs b = backward_args_of(a);
    const bool varlen = !o.cu_seqlens_q.empty();
    const auto like = [&](const TensorView& t, int percent) {
      std::vector<int64_t> shape(t.shape, t.shape + std::clamp(t.rank, 0, kMaxRank));
      return f.view(t.dtype, shape.empty() ? std::vector<int64_t>{varlen ? 0 : 1} : shape, maybe(percent));
    };
    b.dout = like(a.q, 20);
    b.dq = like(a.q, 30);
    b.dk = like(a.k, 30);
    b.dv = like(a.v, 30);
    b.deterministic = f.chance(50);
    c.bwd = b;
    if (f.chance(10))
      c.bwd_aliased = alias_one(f, {&c.bwd->dq, &c.bwd->dk, &c.bwd->dv},
                                {&c.bwd->dq, &c.bwd->dk, &c.bwd->dv, &c.bwd->dout, &c.bwd->q, &c.bwd->k,
                                 &c.bwd->v, &c.bwd->out, &c.bwd->lse});
  }
  if (f.chance(10)) c.fwd_aliased = alias_one(f, {&a.out, &a.lse}, {&a.out, &a.lse, &a.q, &a.k, &a.v});
}

// Whether the call ran; a fusedattn::Error is a refusal, anything else a failure.
template <typename Fn>
bool runs_or_throws_error(Fn&& call) {
  try {
    call();
    return true;
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-fusedattn exception: " << e.what();
  }
  return false;
}

// Whether validation of a call that ran found rows to compute: one without query rows (batch,
// heads or rows 0) returns before the backend, so it does not count as a kernel probed.
bool computes(const ForwardArgs& a) {
  FwdParams p;
  Backend backend;
  return detail::make_fwd_params(a, p, backend);
}
bool computes(const BackwardArgs& a) {
  BwdParams p;
  Backend backend;
  return detail::make_bwd_params(a, p, backend);
}

TEST(ApiFuzz, EveryCallRunsOrThrowsAnError) {
  std::mt19937_64 rng = fresh_rng();
  Fuzzer f(rng);
  int forwards_run = 0, backwards_run = 0;
  for (int i = 0; i < kCalls; ++i) {
    f.next_call();
    Call c;
    fill(f, c);
    SCOPED_TRACE("call " + std::to_string(i));
    const bool forward_computed = runs_or_throws_error([&] { forward(c.fwd); }) && computes(c.fwd);
    forwards_run += forward_computed;
    // A written tensor over another's memory is turned down; only a call with nothing to compute
    // (no query rows, so nothing written) may return without an error.
    EXPECT_FALSE(c.fwd_aliased && forward_computed) << "a forward wrote over another tensor's memory";
    if (c.bwd) {
      const bool ran = runs_or_throws_error([&] { backward(*c.bwd); });
      backwards_run += ran && computes(*c.bwd);
      EXPECT_FALSE(c.bwd_aliased && ran) << "a backward wrote over another tensor's memory";
    }
  }
  // The valid share keeps the kernels in the probe, not only the checks. Only calls that reach the
  // backend count, not those with nothing to compute: over 40 seeds 33-62 forwards and 19-34
  // backwards of the 2,000 did.
  EXPECT_GT(forwards_run, kCalls / kMinComputeShare) << backwards_run;
  EXPECT_GT(backwards_run, kCalls / kMinComputeShare / 2) << forwards_run;
}

// merge_attention's arguments: dense or varlen outputs of any dtype, LSEs of the matching (or a
// wrong) shape, each view perhaps broken.
MergeArgs merge_call(Fuzzer& f) {
  const auto dtype = [&] { return f.pick({DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kInt32}); };
  const int64_t batch = f.pick<int64_t>({0, 1, 3}), seqlen = f.pick<int64_t>({0, 1, 9, 70});
  const int64_t heads = f.pick<int64_t>({0, 1, 4}), d = f.pick<int64_t>({0, 1, 6, 8, 64});
  const bool broken = f.chance(40), varlen = f.chance(30);
  const auto maybe = [&](int percent) { return broken && f.chance(percent); };
  const std::vector<int64_t> out_shape = varlen ? std::vector<int64_t>{seqlen, heads, d}
                                                : std::vector<int64_t>{batch, seqlen, heads, d};
  const std::vector<int64_t> lse_shape = varlen ? std::vector<int64_t>{heads, maybe(10) ? seqlen + 1 : seqlen}
                                                : std::vector<int64_t>{batch, heads, maybe(10) ? seqlen + 1 : seqlen};
  MergeArgs a;
  a.out = f.view(dtype(), out_shape, maybe(30));
  a.part_out = f.view(dtype(), maybe(10) ? std::vector<int64_t>{batch, seqlen, heads, d + 1} : out_shape, maybe(30));
  a.lse = f.view(maybe(10) ? DType::kFloat16 : DType::kFloat32, lse_shape, maybe(30));
  a.part_lse = f.view(DType::kFloat32, lse_shape, maybe(30));
  a.backend = f.pick({Backend::kAuto, Backend::kAuto, Backend::kCPU, Backend::kCUDA});
  a.num_threads = f.pick({0, 1, 2, -1, 1000});
  return a;
}

TEST(ApiFuzz, EveryMergeRunsOrThrowsAnError) {
  std::mt19937_64 rng = fresh_rng();
  Fuzzer f(rng);
  int merges_run = 0;
  for (int i = 0; i < kCalls; ++i) {
    f.next_call();
    const MergeArgs a = merge_call(f);
    SCOPED_TRACE("call " + std::to_string(i));
    merges_run += runs_or_throws_error([&] { merge_attention(a); });
  }
  EXPECT_GT(merges_run, kCalls / kMinRunShare);
}

// append_kv's arguments: per-sequence caches, or pools of pages read through a table of entries
// mostly in range, new tokens, and lengths of any int32 (a sequence whose tokens do not fit its
// positions or pages is reported in status, not written), each view perhaps broken.
AppendKvArgs append_call(Fuzzer& f, std::vector<int32_t>& lengths, bool& aliased) {
  const auto dtype = [&] { return f.pick({DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kInt32}); };
  const DType cache_dtype = dtype();
  const int64_t batch = f.pick<int64_t>({0, 1, 3}), heads = f.pick<int64_t>({0, 1, 4});
  const int64_t d = f.pick<int64_t>({0, 1, 8, 64}), fresh = f.pick<int64_t>({0, 1, 5});
  const int32_t positions = f.pick({0, 1, 16, 70});
  const bool broken = f.chance(40);
  const auto maybe = [&](int percent) { return broken && f.chance(percent); };
  AppendKvArgs a;
  if (f.chance(40)) {  // pools of pages
    const int64_t pages = f.pick<int64_t>({0, 1, 6}), page = maybe(30) ? f.pick<int64_t>({0, 1}) : 16;
    a.k_cache = f.view(cache_dtype, {pages, page, heads, d}, maybe(30));
    a.v_cache = f.view(cache_dtype, {pages, maybe(10) ? page + 1 : page, heads, d}, maybe(30));
    a.block_table = f.view(maybe(10) ? DType::kFloat32 : DType::kInt32,
                           {maybe(10) ? batch + 1 : batch, f.pick<int64_t>({0, 1, 3, 5})}, maybe(30));
    f.fill_entries(a.block_table, static_cast<int32_t>(pages), maybe(50));
  } else {
    a.k_cache = f.view(cache_dtype, {batch, positions, heads, d}, maybe(30));
    a.v_cache = f.view(cache_dtype, {batch, maybe(10) ? positions + 1 : positions, heads, d}, maybe(30));
  }
  a.k = f.view(maybe(10) ? dtype() : cache_dtype, {batch, fresh, heads, d}, maybe(30));
  a.v = f.view(cache_dtype, {batch, fresh, heads, maybe(5) ? d + 8 : d}, maybe(30));
  lengths.clear();
  for (int64_t b = 0; b < batch; ++b)
    lengths.push_back(f.pick({0, 3, positions, positions - 1, -1, std::numeric_limits<int32_t>::max()}));
  if (maybe(10)) lengths.push_back(0);  // one length too many
  a.cache_seqlens = f.offsets(lengths);
  a.status = f.view(maybe(10) ? DType::kFloat32 : DType::kInt32, {maybe(10) ? batch + 1 : batch}, maybe(30));
  a.backend = f.pick({Backend::kAuto, Backend::kAuto, Backend::kCPU, Backend::kCUDA});
  aliased = f.chance(10) && alias_one(f, {&a.k_cache, &a.v_cache, &a.status},
                                      {&a.k_cache, &a.v_cache, &a.status, &a.k, &a.v, &a.cache_seqlens, &a.block_table});
  return a;
}

TEST(ApiFuzz, EveryAppendRunsOrThrowsAnError) {
  std::mt19937_64 rng = fresh_rng();
  Fuzzer f(rng);
  int appends_run = 0;
  std::vector<int32_t> lengths;
  for (int i = 0; i < kCalls; ++i) {
    f.next_call();
    bool aliased = false;
    const AppendKvArgs a = append_call(f, lengths, aliased);
    SCOPED_TRACE("call " + std::to_string(i));
    const bool ran = runs_or_throws_error([&] { append_kv(a); });
    appends_run += ran;
    EXPECT_FALSE(aliased && ran) << "append_kv wrote over another tensor's memory";
  }
  EXPECT_GT(appends_run, kCalls / kMinRunShare);
}

}  // namespace
}  // namespace fusedattn::testing
