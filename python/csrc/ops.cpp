// The fusedattn operators for torch: schemas, and one device-generic kernel per op registered for
// both CPU and CUDA (fusedattn picks its backend from the tensors' device). Outputs and the
// backward workspace come from torch's caching allocator (at::empty); kernels run on the caller's
// current stream under a device guard, so multi-GPU code behaves like any torch op.
//
// Fake (meta) kernels and autograd are registered from Python (python/fusedattn/_ops.py); the
// output shapes and strides below must stay identical to the fake ones there.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "checked_offsets.h"
#include "fusedattn/attention.h"
#include "fusedattn/kv_cache.h"
#include "fusedattn/merge.h"
#include "torch_views.h"

namespace fusedattn::torch_binding {
namespace {

constexpr const char* kDenseLayout = "[batch, seqlen, heads, head_dim]";
constexpr const char* kVarlenLayout = "[total_tokens, heads, head_dim]";
constexpr const char* kPagedLayout = "[num_pages, page_size, heads, head_dim]";
constexpr int64_t kDenseRank = 4;
constexpr int64_t kVarlenRank = 3;
constexpr int64_t kPagedRank = 4;

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// softmax_lse: [batch, heads, seqlen_q] for dense q, [heads, total_q] for packed q (flash_attn's).
at::Tensor empty_lse(const at::Tensor& q, bool varlen) {
  const auto options = q.options().dtype(at::kFloat);
  return varlen ? at::empty({q.size(1), q.size(0)}, options) : at::empty({q.size(0), q.size(2), q.size(1)}, options);
}

// The offsets, unchecked: the library checks them on the host unless checked_rows_q/k say so.
void set_offsets(Options& options, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                 int64_t max_seqlen_q, int64_t max_seqlen_k) {
  options.cu_seqlens_q = to_view(cu_seqlens_q, "cu_seqlens_q");
  options.cu_seqlens_k = to_view(cu_seqlens_k, "cu_seqlens_k");
  options.max_seqlen_q = max_seqlen_q;
  options.max_seqlen_k = max_seqlen_k;
}

// The offsets and, unless the device checks them (options.check_on_device, set first), their
// check on the host (checked_offsets.h: once per offsets tensor and version) against the packed q
// and k.
void set_varlen(Options& options, const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                int64_t max_seqlen_q, int64_t max_seqlen_k, const at::Tensor& q, const at::Tensor& k) {
  set_offsets(options, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  if (!options.check_on_device) set_checked_rows(options, cu_seqlens_q, cu_seqlens_k, q.size(0), k.size(0));
}

std::tuple<at::Tensor, at::Tensor> run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               Options options, bool varlen) {
  // Same strides as q (a BHSD-laid-out q gives a BHSD-laid-out out): no layout change, no copy.
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = empty_lse(q, varlen);
  // Views the CUDA kernels cannot read in place are read through copies, alive until return (the
  // caching allocator orders their reuse after the kernels on this stream).
  const at::Tensor q_read = readable_by_kernels(q, "q"), k_read = readable_by_kernels(k, "k"),
                   v_read = readable_by_kernels(v, "v");
  ForwardArgs args;
  args.q = to_view(q_read, "q");
  args.k = to_view(k_read, "k");
  args.v = to_view(v_read, "v");
  args.out = to_view(out, "out");
  args.lse = to_view(lse, "softmax_lse");
  args.options = options;
  forward(args);
  return {out, lse};
}

Grads run_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& out, const at::Tensor& lse, Options options, bool deterministic) {
  at::Tensor dq = at::empty_like(q);
  at::Tensor dk = at::empty_like(k);
  at::Tensor dv = at::empty_like(v);
  const at::Tensor dout_read = readable_by_kernels(dout, "dout"), q_read = readable_by_kernels(q, "q"),
                   k_read = readable_by_kernels(k, "k"), v_read = readable_by_kernels(v, "v"),
                   out_read = readable_by_kernels(out, "out");
  BackwardArgs args;
  args.dout = to_view(dout_read, "dout");
  args.q = to_view(q_read, "q");
  args.k = to_view(k_read, "k");
  args.v = to_view(v_read, "v");
  args.out = to_view(out_read, "out");
  args.lse = to_view(lse, "softmax_lse");
  args.dq = to_view(dq, "dq");
  args.dk = to_view(dk, "dk");
  args.dv = to_view(dv, "dv");
  args.options = options;
  args.deterministic = deterministic;
  // Scratch from torch's caching allocator rather than the library's own stream-ordered malloc:
  // it is reused across calls and counted in torch.cuda.memory_allocated().
  const std::size_t bytes = backward_workspace_bytes(args);
  at::Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
    args.workspace = workspace.data_ptr();
    args.workspace_bytes = bytes;
  }
  backward(args);
  return {dq, dk, dv};
}

// The dense calls' options, with the column mask (Options::column_mask) where one is given.
Options dense_options(const at::Tensor& q, std::optional<double> softmax_scale, bool causal, int64_t window_left,
                      int64_t window_right, const std::optional<at::Tensor>& column_mask) {
  Options options = make_options(q.device(), softmax_scale, causal, window_left, window_right);
  if (column_mask) options.column_mask = to_view(*column_mask, "column_mask");
  return options;
}

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, bool /*deterministic: read by autograd only*/,
                                       const std::optional<at::Tensor>& column_mask) {
  return translate_errors([&] {
    expect_rank(q, "q", kDenseRank, kDenseLayout);
    c10::DeviceGuard guard(q.device());
    return run_forward(q, k, v, dense_options(q, softmax_scale, causal, window_left, window_right, column_mask),
                       /*varlen=*/false);
  });
}

Grads bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
          const at::Tensor& out, const at::Tensor& softmax_lse, std::optional<double> softmax_scale, bool causal,
          int64_t window_left, int64_t window_right, bool deterministic,
          const std::optional<at::Tensor>& column_mask) {
  return translate_errors([&] {
    c10::DeviceGuard guard(q.device());
    return run_backward(dout, q, k, v, out, softmax_lse,
                        dense_options(q, softmax_scale, causal, window_left, window_right, column_mask), deterministic);
  });
}

std::tuple<at::Tensor, at::Tensor> varlen_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k,
                                              std::optional<double> softmax_scale, bool causal,
                                              int64_t window_left, int64_t window_right,
                                              bool /*deterministic: read by autograd only*/,
                                              const std::optional<at::Tensor>& seqused_k,
                                              const std::optional<at::Tensor>& block_table, int64_t checked_rows_k,
                                              bool check_on_device) {
  return translate_errors([&] {
    expect_rank(q, "q", kVarlenRank, kVarlenLayout);
    if (block_table)
      expect_rank(k, "k", kPagedRank, kPagedLayout);
    else
      expect_rank(k, "k", kVarlenRank, kVarlenLayout);
    c10::DeviceGuard guard(q.device());
    Options options = make_options(q.device(), softmax_scale, causal, window_left, window_right);
    options.check_on_device = check_on_device;
    if (checked_rows_k >= 0 && !block_table)
      throw Error(ErrorCode::kInvalidArgument, "checked_rows_k",
                  "is for paged calls (block_table); unpaged offsets are checked once per tensor version");
    if (block_table) {
      // No checked-offsets cache here: it checks cu_seqlens_k against k's rows, which are pages
      // now, and a cached check would also skip the library's host check of the table's entries
      // (Options::block_table). The library reads the offsets and the table every paged call,
      // unless the caller has checked both (checked_rows_k: the rows cu_seqlens_k spans).
      set_offsets(options, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
      options.block_table = to_view(*block_table, "block_table");
      if (checked_rows_k >= 0) {
        set_checked_rows_q(options, cu_seqlens_q, q.size(0));
        options.checked_rows_k = checked_rows_k;
      }
    } else {
      set_varlen(options, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k);
    }
    if (seqused_k) options.seqused_k = to_view(*seqused_k, "seqused_k");
    return run_forward(q, k, v, options, /*varlen=*/true);
  });
}

Grads varlen_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& out, const at::Tensor& softmax_lse, const at::Tensor& cu_seqlens_q,
                 const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                 std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                 bool deterministic, bool check_on_device) {
  return translate_errors([&] {
    expect_rank(q, "q", kVarlenRank, kVarlenLayout);
    expect_rank(k, "k", kVarlenRank, kVarlenLayout);
    c10::DeviceGuard guard(q.device());
    Options options = make_options(q.device(), softmax_scale, causal, window_left, window_right);
    options.check_on_device = check_on_device;
    set_varlen(options, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q, k);
    return run_backward(dout, q, k, v, out, softmax_lse, options, deterministic);
  });
}

// fusedattn::append_kv (kv_cache.h): the new tokens written into the caches in place, where each
// sequence's length (and table) allow; returns the int32 status per sequence (AppendStatus).
at::Tensor append_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& block_table) {
  return translate_errors([&] {
    c10::DeviceGuard guard(k_cache.device());
    at::Tensor status = at::empty({k.size(0)}, cache_seqlens.options().dtype(at::kInt));
    AppendKvArgs a;
    a.k_cache = to_view(k_cache, "k_cache");
    a.v_cache = to_view(v_cache, "v_cache");
    a.k = to_view(k, "k");
    a.v = to_view(v, "v");
    a.cache_seqlens = to_view(cache_seqlens, "cache_seqlens");
    if (block_table) a.block_table = to_view(*block_table, "block_table");
    a.status = to_view(status, "status");
    a.stream = current_stream(k_cache.device());
    append_kv(a);
    return status;
  });
}

// fusedattn::merge_attention (merge.h): the attention over part_out's keys folded into out and
// lse, in place.
void merge_attention(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out,
                     const at::Tensor& part_lse) {
  translate_errors([&] {
    c10::DeviceGuard guard(out.device());
    MergeArgs a;
    a.out = to_view(out, "out");
    a.lse = to_view(lse, "lse");
    a.part_out = to_view(part_out, "part_out");
    a.part_lse = to_view(part_lse, "part_lse");
    a.stream = current_stream(out.device());
    fusedattn::merge_attention(a);
  });
}

}  // namespace

TORCH_LIBRARY(fusedattn, m) {
  // Where the fake kernels live: torch names this module when a fake kernel is missing.
  m.set_python_module("fusedattn._ops");
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale, bool causal, int window_left, int window_right, "
      "bool deterministic=False, Tensor? column_mask=None) -> (Tensor out, Tensor softmax_lse)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float? softmax_scale, "
      "bool causal, int window_left, int window_right, bool deterministic=False, Tensor? column_mask=None) -> "
      "(Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float? softmax_scale, bool causal, int window_left, int window_right, "
      "bool deterministic=False, Tensor? seqused_k=None, Tensor? block_table=None, int checked_rows_k=-1, "
      "bool check_on_device=False) -> (Tensor out, Tensor softmax_lse)");
  // Options::check_on_device's faults, raised (fusedattn::check_device_errors); waits for the device.
  m.def("check_device_errors(Device device) -> ()", [](const c10::Device& device) {
    translate_errors([&] {
      Device d;
      if (device.is_cuda()) {
        d.type = DeviceType::kCUDA;
        d.index = device.index();  // the Python caller resolves "cuda" to the current device
      }
      check_device_errors(d);
    });
  });
  m.def(
      "append_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor cache_seqlens, "
      "Tensor? block_table=None) -> Tensor status");
  m.def("merge_attention(Tensor(a!) out, Tensor(b!) lse, Tensor part_out, Tensor part_lse) -> ()");
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float? softmax_scale, bool causal, "
      "int window_left, int window_right, bool deterministic=False, bool check_on_device=False) -> "
      "(Tensor dq, Tensor dk, Tensor dv)");
}

// fusedattn chooses its backend from the tensors' device, so the same kernels serve both keys.
TORCH_LIBRARY_IMPL(fusedattn, CPU, m) {
  m.impl("append_kv", &append_kv);
  m.impl("merge_attention", &merge_attention);
  m.impl("fwd", &fwd);
  m.impl("bwd", &bwd);
  m.impl("varlen_fwd", &varlen_fwd);
  m.impl("varlen_bwd", &varlen_bwd);
}

TORCH_LIBRARY_IMPL(fusedattn, CUDA, m) {
  m.impl("append_kv", &append_kv);
  m.impl("merge_attention", &merge_attention);
  m.impl("fwd", &fwd);
  m.impl("bwd", &bwd);
  m.impl("varlen_fwd", &varlen_fwd);
  m.impl("varlen_bwd", &varlen_bwd);
}

}  // namespace fusedattn::torch_binding
