#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "api/layout.h"
#include "api/overlap.h"
#include "cuda/cuda_backend.h"

namespace fusedattn::detail {

Error fault_error(const OffsetsFault& f) {
  const std::string cu = f.keys ? "cu_seqlens_k" : "cu_seqlens_q";
  const std::string seq = "sequence " + std::to_string(f.sequence);
  const auto entry = [](int64_t i, int64_t v) { return "entry " + std::to_string(i) + " (" + std::to_string(v) + ")"; };
  switch (static_cast<OffsetsFaultKind>(f.kind)) {
    case OffsetsFaultKind::kFirstNotZero:
      return Error(ErrorCode::kInvalidArgument, cu, "must start at 0, got " + std::to_string(f.value));
    case OffsetsFaultKind::kDecreasing:
      return Error(ErrorCode::kInvalidArgument, cu,
                   "must be non-decreasing; " + entry(f.entry, f.value) + " is below " + entry(f.entry - 1, f.bound));
    case OffsetsFaultKind::kPastRows:
      return Error(ErrorCode::kShapeMismatch, cu,
                   entry(f.entry, f.value) + " exceeds the packed tensor's " + std::to_string(f.bound) + " rows");
    case OffsetsFaultKind::kTooLong:
      return Error(ErrorCode::kInvalidArgument, f.keys ? "max_seqlen_k" : "max_seqlen_q",
                   "is " + std::to_string(f.bound) + " but " + seq + " has length " + std::to_string(f.value));
    case OffsetsFaultKind::kPagesPastTable:
      return Error(ErrorCode::kShapeMismatch, "block_table",
                   seq + " has " + std::to_string(f.value) + " keys, which need " +
                       std::to_string((f.value + f.detail - 1) / f.detail) + " pages of " + std::to_string(f.detail) +
                       " rows; the table has " + std::to_string(f.bound) + " columns");
    case OffsetsFaultKind::kPageOutside:
      return Error(ErrorCode::kInvalidArgument, "block_table",
                   "entry [" + std::to_string(f.sequence) + ", " + std::to_string(f.entry) + "] is " +
                       std::to_string(f.value) + "; " + seq + "'s keys reach it, so it must name a page in [0, " +
                       std::to_string(f.bound) + ")");
    case OffsetsFaultKind::kNone: break;
  }
  return Error(ErrorCode::kRuntime, cu, "unknown fault kind " + std::to_string(f.kind));
}

namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& arg, const std::string& msg) {
  throw Error(code, arg, msg);
}

// A view's sizes for a message. Messages may describe a view whose rank has not been checked yet
// (a table of the wrong rank): one outside [0, kMaxRank] is named, not read past the shape.
std::string shape_str(const TensorView& t) {
  if (t.rank < 0 || t.rank > kMaxRank) return "rank " + std::to_string(t.rank);
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

// Whether a view of non-negative sizes holds any element: no size is 0. (numel() != 0 says the
// same, but its product can overflow before validation has bounded the sizes.)
bool has_elements(const TensorView& t) {
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] == 0) return false;
  return true;
}

// Every tensor argument: the expected rank, non-negative sizes, present unless empty, contiguous
// last dim (unless `contiguous_last` is false: a tensor read and written element by element), no
// negative stride (no framework makes one, and the TMA descriptors cannot encode it).
// The rank goes first: the other checks index the shape by it.
void check_tensor(const TensorView& t, const char* name, int rank, const char* layout, bool contiguous_last = true) {
  if (t.rank != rank)
    fail(ErrorCode::kShapeMismatch, name,
         "expected rank " + std::to_string(rank) + " " + layout + ", got rank " + std::to_string(t.rank));
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] < 0)
      fail(ErrorCode::kInvalidArgument, name, "negative size " + std::to_string(t.shape[d]) +
                                                  " in dimension " + std::to_string(d));
  if (t.data == nullptr && has_elements(t)) fail(ErrorCode::kInvalidArgument, name, "data pointer is null");
  // A tensor without elements has no layout to read (torch gives the gradient of an empty output
  // stride 0, which .contiguous() leaves as it is).
  if (!has_elements(t)) return;
  if (contiguous_last && t.shape[rank - 1] > 1 && t.stride[rank - 1] != 1)
    fail(ErrorCode::kLayout, name,
         "the last dimension must be contiguous (stride 1), got stride " + std::to_string(t.stride[rank - 1]));
  for (int d = 0; d < t.rank; ++d)
    if (t.shape[d] > 1 && t.stride[d] < 0)
      fail(ErrorCode::kLayout, name, "negative stride " + std::to_string(t.stride[d]) + " in dimension " +
                                         std::to_string(d) + "; strides must be >= 0");
}

// A tensor the call writes must not map two elements to one address: several threads would write
// it, a race and a silent wrong answer. A dimension of stride 0 (an expanded view) is the common
// case and gets its own message. Otherwise the check is the one every framework's views pass: taken
// in order of stride, each dimension's stride steps past the last offset the dimensions of smaller
// stride reach. It turns down the rare interleaved layout that does not overlap (sizes [3, 2],
// strides [2, 3]), which no framework makes. A tensor without elements (any size 0, e.g. head_dim
// 0, whose contiguous strides are 0) writes nothing. Dimensions of size 1 take no part.
void check_written(const TensorView& t, const char* name) {
  if (!has_elements(t)) return;
  int dims[kMaxRank];
  const int n = dims_by_stride(t, dims);  // strides of 0 first (check_tensor turned negative ones down)
  int64_t reach = 0;  // the last offset the dimensions taken so far reach
  for (int i = 0; i < n; ++i) {
    const int d = dims[i];
    if (t.stride[d] == 0)
      fail(ErrorCode::kLayout, name, "stride 0 in dimension " + std::to_string(d) +
                                         " (size " + std::to_string(t.shape[d]) +
                                         "): a written tensor's elements must not share memory");
    if (t.stride[d] <= reach)
      fail(ErrorCode::kLayout, name, "dimension " + std::to_string(d) + " (size " + std::to_string(t.shape[d]) +
                                         ", stride " + std::to_string(t.stride[d]) +
                                         ") overlaps the dimensions of smaller stride, which reach offset " +
                                         std::to_string(reach) + ": a written tensor's elements must not share memory");
    // Saturating: past int64 no later stride can step over it, and no buffer holds such a tensor.
    const int64_t steps = t.shape[d] - 1;
    reach = t.stride[d] > (std::numeric_limits<int64_t>::max() - reach) / steps
                ? std::numeric_limits<int64_t>::max()
                : reach + t.stride[d] * steps;
  }
}

// A tensor of a call, named as in the API, for the check that written tensors stay apart.
struct Named {
  ByteView bytes;
  const char* name;
};
Named named(const TensorView& t, const char* name) { return {bytes_of(t), name}; }

// No byte of a written tensor may lie in another written tensor or in a tensor the call reads:
// the kernels read their inputs while they write (a forward's output over a transposed view of q
// was a wrong answer on the CPU), and two writers of one byte race. Views of one buffer that stay
// apart byte for byte (q, k and v of a packed qkv, dq, dk and dv of a packed gradient) pass.
void check_apart(std::initializer_list<Named> written, std::initializer_list<Named> read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    const auto check = [&](const Named& other, const char* role) {
      const Overlap o = overlap(w->bytes, other.bytes);
      if (o == Overlap::kApart) return;
      fail(ErrorCode::kLayout, w->name,
           std::string(o == Overlap::kShared ? "shares memory with " : "may share memory with ") + other.name +
               (o == Overlap::kShared ? "" : " (their strides interleave too finely to rule it out)") + ", " +
               role + "; a tensor the call writes must not overlap any tensor it reads or writes");
    };
    for (auto other = written.begin(); other != w; ++other) check(*other, "which the call also writes");
    for (const Named& other : read) check(other, "which the call reads");
  }
}

// Whether two views are one: the same elements in the same places.
bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.stride[d] != b.stride[d])) return false;
  return true;
}

void check_same_shape(const TensorView& a, const char* an, const TensorView& b, const char* bn) {
  for (int d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d])
      fail(ErrorCode::kShapeMismatch, an, "shape " + shape_str(a) + " must equal " + bn + "'s " + shape_str(b));
}

void check_dtype(const TensorView& t, const char* name, DType want, const char* want_name) {
  if (t.dtype != want)
    fail(ErrorCode::kDtypeMismatch, name,
         std::string("dtype ") + dtype_name(t.dtype) + " must match " + want_name + " (" + dtype_name(want) + ")");
}

void check_device(const TensorView& t, const char* name, const Device& want) {
  if (t.device != want)
    fail(ErrorCode::kDeviceMismatch, name, "is on a different device than q; all tensors must share one device");
}

// The CUDA kernels load 16-byte vectors: base pointers and all non-unit strides must allow that.
void check_cuda_alignment(const TensorView& t, const char* name) {
  const int d = cuda_misalignment(t);
  if (d == kCudaAligned) return;
  if (d == kCudaMisalignedData) fail(ErrorCode::kLayout, name, "the CUDA backend needs a 16-byte aligned data pointer");
  const int64_t elems = kCudaAlignBytes / static_cast<int64_t>(dtype_size(t.dtype));
  fail(ErrorCode::kLayout, name,
       "the CUDA backend needs every stride to be a multiple of " + std::to_string(elems) +
           " elements (16 bytes); stride of dimension " + std::to_string(d) + " is " + std::to_string(t.stride[d]));
}

OperandStrides strides_of(const TensorView& t, bool varlen) {
  // dense [B, S, H, D] or varlen [total, H, D]
  if (varlen) return {0, t.stride[0], t.stride[1]};
  return {t.stride[0], t.stride[1], t.stride[2]};
}

[[noreturn]] void fail_with(OffsetsFaultKind kind, bool keys, int64_t sequence, int64_t entry, int64_t value,
                            int64_t bound, int64_t detail = 0) {
  throw fault_error({static_cast<int32_t>(kind), keys ? 1 : 0, sequence, entry, value, bound, detail});
}

// Reads cu_seqlens (copying it to the host for CUDA tensors) and checks it: starts at 0, never
// decreases, no sequence longer than the declared maximum, no offset past the packed rows.
// Returns the last offset: the packed rows the sequences use.
// `host_out`, when given, receives the offsets.
int64_t check_cu_seqlens(const TensorView& cu, bool keys, int64_t batch, int64_t total, int64_t max_len,
                         Backend backend, const Device& device, void* stream,
                         std::vector<int32_t>* host_out = nullptr) {
  std::vector<int32_t> host(static_cast<size_t>(batch + 1));
  if (backend == Backend::kCUDA)
    cuda::copy_to_host(host.data(), cu.data, host.size() * sizeof(int32_t), device.index, stream);
  else
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<const int32_t*>(cu.data)[i];
  if (host[0] != 0) fail_with(OffsetsFaultKind::kFirstNotZero, keys, 0, 0, host[0], 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t{host[b + 1]} - host[b];
    if (len < 0) fail_with(OffsetsFaultKind::kDecreasing, keys, b, b + 1, host[b + 1], host[b]);
    if (len > max_len) fail_with(OffsetsFaultKind::kTooLong, keys, b, b + 1, len, max_len);
  }
  if (host[batch] > total) fail_with(OffsetsFaultKind::kPastRows, keys, batch - 1, batch, host[batch], total);
  const int64_t rows = host[batch];
  if (host_out) *host_out = std::move(host);
  return rows;
}

// The device rule of the tensors that go with q.
constexpr const char* kOnQsDevice = "must be on the same device as q";

void check_cu_tensor(const TensorView& cu, const char* name, const Device& device) {
  if (cu.rank != 1) fail(ErrorCode::kShapeMismatch, name, "must be a 1-D int32 tensor of batch + 1 offsets");
  if (cu.dtype != DType::kInt32) fail(ErrorCode::kDtypeMismatch, name, std::string("must be int32, got ") + dtype_name(cu.dtype));
  if (cu.shape[0] < 1) fail(ErrorCode::kShapeMismatch, name, "must hold at least one offset (batch + 1 entries)");
  if (cu.data == nullptr) fail(ErrorCode::kInvalidArgument, name, "data pointer is null");
  if (cu.device != device) fail(ErrorCode::kDeviceMismatch, name, kOnQsDevice);
  if (cu.shape[0] > 1 && cu.stride[0] != 1) fail(ErrorCode::kLayout, name, "must be contiguous");
}

// An int32 index tensor (key counts, masks, tables, cache lengths), after its shape: its dtype,
// its data where it has entries, and its device (`device_rule` the message where it is not
// `device`).
void check_int32_tensor(const TensorView& t, const char* name, bool has_entries, const Device& device,
                        const char* device_rule) {
  if (t.dtype != DType::kInt32) fail(ErrorCode::kDtypeMismatch, name, std::string("must be int32, got ") + dtype_name(t.dtype));
  if (has_entries && t.data == nullptr) fail(ErrorCode::kInvalidArgument, name, "data pointer is null");
  if (t.device != device) fail(ErrorCode::kDeviceMismatch, name, device_rule);
}

// seqused_k (Options): a variable-length forward's int32 [batch] key counts, read only by the
// kernels (which clamp each entry), so only its description is checked here.
void check_seqused_k(const TensorView& used, bool varlen, bool backward, int64_t batch, const Device& device) {
  const char* name = "seqused_k";
  if (!varlen) fail(ErrorCode::kInvalidArgument, name, "needs a variable-length call (cu_seqlens_q/k)");
  if (backward) fail(ErrorCode::kUnsupported, name, "is supported by the forward only, as in flash_attn");
  if (used.rank != 1 || used.shape[0] != batch)
    fail(ErrorCode::kShapeMismatch, name, "must be a 1-D int32 tensor of " + std::to_string(batch) +
                                              " key counts, one per sequence");
  check_int32_tensor(used, name, batch > 0, device, kOnQsDevice);
  if (batch > 1 && used.stride[0] != 1) fail(ErrorCode::kLayout, name, "must be contiguous");
}

// column_mask (Options): int32 [batch, 1 or heads_q, seqlen_k, 2 or 4] on a dense call; both
// backends read it (on CUDA the portable kernels, and the Hopper forward at d64/d128). Its entries are row bounds:
// any value is valid.
void check_column_mask(const TensorView& m, bool varlen, int64_t batch, int64_t hq, int64_t sk, const Device& device) {
  const char* name = "column_mask";
  if (varlen) fail(ErrorCode::kUnsupported, name, "is supported on dense calls only, not with cu_seqlens_q/k");
  const std::string want = "an int32 [" + std::to_string(batch) + ", 1 or " + std::to_string(hq) + ", " +
                           std::to_string(sk) + ", 2 or 4] tensor (per key, the bounds of one or two intervals "
                           "of query rows it hides from)";
  if (m.rank != 4 || m.shape[0] != batch || (m.shape[1] != 1 && m.shape[1] != hq) || m.shape[2] != sk ||
      (m.shape[3] != 2 && m.shape[3] != 4))
    fail(ErrorCode::kShapeMismatch, name, "must be " + want + ", got " + shape_str(m));
  check_int32_tensor(m, name, batch * m.shape[1] * sk > 0, device, kOnQsDevice);
  if (m.stride[3] != 1) fail(ErrorCode::kLayout, name, "each key's bounds must be contiguous (last stride 1)");
  for (int d = 0; d < 3; ++d)
    if (m.shape[d] > 1 && m.stride[d] < 0)
      fail(ErrorCode::kLayout, name, "negative stride " + std::to_string(m.stride[d]) + " in dimension " +
                                         std::to_string(d) + "; strides must be >= 0");
}

// block_table (Options): its description, before anything reads it (fill_common has already
// asked for a variable-length forward).
void check_block_table_tensor(const TensorView& table, int64_t batch, const Device& device) {
  const char* name = "block_table";
  if (table.rank != 2 || table.shape[0] != batch || table.shape[1] < 1)
    fail(ErrorCode::kShapeMismatch, name, "must be an int32 [" + std::to_string(batch) +
                                              ", max_pages_per_seq] tensor (at least one column), got " +
                                              shape_str(table));
  check_int32_tensor(table, name, batch > 0, device, kOnQsDevice);
  if (table.shape[1] > 1 && table.stride[1] != 1) fail(ErrorCode::kLayout, name, "each row's entries must be contiguous");
  if (table.shape[0] > 1 && table.stride[0] < table.shape[1])
    fail(ErrorCode::kLayout, name, "rows must not overlap (row stride " + std::to_string(table.stride[0]) + ")");
}

// Entries between the table's rows: its row stride, or (one row, whose stride no framework pins
// down) its width.
int64_t table_row_stride(const TensorView& table) { return table.shape[0] > 1 ? table.stride[0] : table.shape[1]; }

// The pages each sequence's keys reach (its cu_seqlens_k length, from the offsets read on the
// host): within the table's columns, each entry a page of k/v. Reads those columns of the table
// on the host (a table sized for the longest context costs nothing past them).
void check_block_table_pages(const TensorView& table, const std::vector<int32_t>& offsets, int64_t page_size,
                             int64_t num_pages, Backend backend, const Device& device, void* stream) {
  const int64_t batch = table.shape[0], cols = table.shape[1], row_stride = table_row_stride(table);
  std::vector<int64_t> pages(static_cast<size_t>(batch));
  int64_t reached = 0;  // columns some sequence's keys reach
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t{offsets[b + 1]} - offsets[b];
    pages[b] = (len + page_size - 1) / page_size;
    if (pages[b] > cols) fail_with(OffsetsFaultKind::kPagesPastTable, true, b, 0, len, cols, page_size);
    reached = std::max(reached, pages[b]);
  }
  if (reached == 0) return;
  std::vector<int32_t> host(static_cast<size_t>(batch * reached));
  const auto* entries = static_cast<const int32_t*>(table.data);
  if (backend == Backend::kCUDA)
    cuda::copy_rows_to_host(host.data(), entries, reached * sizeof(int32_t), batch, row_stride * sizeof(int32_t),
                            device.index, stream);
  else
    for (int64_t b = 0; b < batch; ++b) std::copy_n(entries + b * row_stride, reached, host.begin() + b * reached);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < pages[b]; ++j) {
      const int32_t page = host[static_cast<size_t>(b * reached + j)];
      if (page < 0 || page >= num_pages) fail_with(OffsetsFaultKind::kPageOutside, true, b, j, page, num_pages);
    }
}

// Everything shared by forward and backward, from the forward-side tensors.
// Returns false for a valid no-op.
bool fill_common(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* out,
                 const TensorView& lse, const Options& opt, bool backward, FwdParams& p, Backend& backend) {
  const bool varlen = !opt.cu_seqlens_q.empty() || !opt.cu_seqlens_k.empty();
  if (varlen && (opt.cu_seqlens_q.empty() || opt.cu_seqlens_k.empty()))
    fail(ErrorCode::kInvalidArgument, opt.cu_seqlens_q.empty() ? "cu_seqlens_q" : "cu_seqlens_k",
         "variable-length calls need both cu_seqlens_q and cu_seqlens_k");
  const int rank = varlen ? 3 : 4;
  const char* layout = varlen ? "[total_tokens, heads, head_dim]" : "[batch, seqlen, heads, head_dim]";
  // Paged K/V (Options::block_table): pages of rows, whatever q's layout.
  const bool paged = !opt.block_table.empty();
  if (paged && !varlen) fail(ErrorCode::kInvalidArgument, "block_table", "needs a variable-length call (cu_seqlens_q/k)");
  if (paged && backward) fail(ErrorCode::kUnsupported, "block_table", "is supported by the forward only, as in flash_attn");
  const int krank = paged ? 4 : rank;
  const char* klayout = paged ? "[num_pages, page_size, heads, head_dim] (paged by block_table)" : layout;
  check_tensor(q, "q", rank, layout);
  check_tensor(k, "k", krank, klayout);
  check_tensor(v, "v", krank, klayout);
  check_same_shape(v, "v", k, "k");
  if (out) {
    check_tensor(*out, "out", rank, layout);
    check_same_shape(*out, "out", q, "q");
  }

  if (q.dtype == DType::kFloat8E4M3 || q.dtype == DType::kFloat8E5M2)
    fail(ErrorCode::kUnsupported, "q", "fp8 inputs are reserved and not supported yet; use fp16, bf16 or fp32");
  if (q.dtype == DType::kInt32) fail(ErrorCode::kDtypeMismatch, "q", "must be fp16, bf16 or fp32, got int32");
  check_dtype(k, "k", q.dtype, "q");
  check_dtype(v, "v", q.dtype, "q");
  if (out) check_dtype(*out, "out", q.dtype, "q");

  const Device device = q.device;
  check_device(k, "k", device);
  check_device(v, "v", device);
  if (out) check_device(*out, "out", device);
  backend = choose_backend(opt.backend, device);

  const int64_t hq = q.shape[rank - 2], hkv = k.shape[krank - 2], d = q.shape[rank - 1];
  if (k.shape[krank - 1] != d)
    fail(ErrorCode::kShapeMismatch, "k", "head_dim " + std::to_string(k.shape[krank - 1]) + " must equal q's " + std::to_string(d));
  if (!varlen && k.shape[0] != q.shape[0])
    fail(ErrorCode::kShapeMismatch, "k", "batch " + std::to_string(k.shape[0]) + " must equal q's " + std::to_string(q.shape[0]));
  if (hkv == 0 && hq != 0)
    fail(ErrorCode::kInvalidArgument, "k", "has 0 heads while q has " + std::to_string(hq));
  if (hkv != 0 && hq % hkv != 0)
    fail(ErrorCode::kShapeMismatch, "q", "number of heads (" + std::to_string(hq) +
                                             ") must be a multiple of the KV heads (" + std::to_string(hkv) + ")");
  if (opt.window_left < -1)
    fail(ErrorCode::kInvalidArgument, "window_left", "must be -1 (unbounded) or >= 0, got " + std::to_string(opt.window_left));
  if (opt.window_right < -1)
    fail(ErrorCode::kInvalidArgument, "window_right", "must be -1 (unbounded) or >= 0, got " + std::to_string(opt.window_right));
  if (opt.causal && opt.window_right > 0)
    fail(ErrorCode::kInvalidArgument, "window_right", "must be -1 or 0 when causal is set (causal means window_right = 0)");
  if (opt.softmax_scale && !std::isfinite(*opt.softmax_scale))
    fail(ErrorCode::kInvalidArgument, "softmax_scale", "must be finite");

  int64_t batch, sq, sk;
  if (varlen) {
    check_cu_tensor(opt.cu_seqlens_q, "cu_seqlens_q", device);
    check_cu_tensor(opt.cu_seqlens_k, "cu_seqlens_k", device);
    if (opt.cu_seqlens_k.shape[0] != opt.cu_seqlens_q.shape[0])
      fail(ErrorCode::kShapeMismatch, "cu_seqlens_k", "must have as many entries as cu_seqlens_q (" +
                                                          std::to_string(opt.cu_seqlens_q.shape[0]) + ")");
    if (opt.max_seqlen_q < 0) fail(ErrorCode::kInvalidArgument, "max_seqlen_q", "must be >= 0");
    if (opt.max_seqlen_k < 0) fail(ErrorCode::kInvalidArgument, "max_seqlen_k", "must be >= 0");
    batch = opt.cu_seqlens_q.shape[0] - 1;
    sq = opt.max_seqlen_q;
    sk = opt.max_seqlen_k;
  } else {
    batch = q.shape[0];
    sq = q.shape[1];
    sk = k.shape[1];
  }
  if (!opt.seqused_k.empty()) check_seqused_k(opt.seqused_k, varlen, backward, batch, device);
  if (paged) check_block_table_tensor(opt.block_table, batch, device);
  const bool column_masked = !opt.column_mask.empty();
  if (column_masked) check_column_mask(opt.column_mask, varlen, batch, hq, sk, device);
  const int64_t page_size = paged ? k.shape[1] : 0, num_pages = paged ? k.shape[0] : 0;
  // Every key row of a paged call lies in some page (key_page clamps into them, so none may be empty).
  if (paged && (page_size < 1 || num_pages < 1))
    fail(ErrorCode::kShapeMismatch, "k", "paged K/V needs at least one page of at least one row, got " + shape_str(k));

  // lse: dense [B, Hq, Sq], varlen [Hq, total_q]; fp32.
  if (!lse.empty()) {
    const int lrank = varlen ? 2 : 3;
    check_tensor(lse, "lse", lrank, varlen ? "[heads, total_q]" : "[batch, heads, seqlen_q]");
    check_dtype(lse, "lse", DType::kFloat32, "fp32");
    check_device(lse, "lse", device);
    const bool ok = varlen ? (lse.shape[0] == hq && lse.shape[1] == q.shape[0])
                           : (lse.shape[0] == batch && lse.shape[1] == hq && lse.shape[2] == sq);
    if (!ok)
      fail(ErrorCode::kShapeMismatch, "lse",
           "shape " + shape_str(lse) + " must be " +
               (varlen ? "[" + std::to_string(hq) + ", " + std::to_string(q.shape[0]) + "]"
                       : "[" + std::to_string(batch) + ", " + std::to_string(hq) + ", " + std::to_string(sq) + "]"));
  } else if (backward) {
    fail(ErrorCode::kInvalidArgument, "lse", "is required by backward (the forward's softmax_lse)");
  }

  p = FwdParams{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out ? out->data : nullptr;
  p.lse = lse.empty() ? nullptr : static_cast<float*>(lse.data);
  p.q_stride = strides_of(q, varlen);
  p.k_stride = strides_of(k, varlen && !paged);
  p.v_stride = strides_of(v, varlen && !paged);
  if (out) p.o_stride = strides_of(*out, varlen);
  if (!lse.empty()) {
    p.lse_batch_stride = varlen ? 0 : lse.stride[0];
    p.lse_head_stride = varlen ? lse.stride[0] : lse.stride[1];
  }
  p.dtype = q.dtype;
  p.batch = static_cast<int>(batch);
  p.heads_q = static_cast<int>(hq);
  p.heads_kv = static_cast<int>(hkv);
  p.head_dim = static_cast<int>(d);
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.device = device;
  p.stream = opt.stream;
  p.num_threads = opt.num_threads;
  p.scale = opt.softmax_scale ? *opt.softmax_scale : (d > 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : 1.0f);
  p.scale_log2 = static_cast<float>(static_cast<double>(p.scale) * M_LOG2E);
  p.window_left = opt.window_left;
  p.window_right = opt.causal ? 0 : opt.window_right;
  if (column_masked) {
    const TensorView& m = opt.column_mask;
    p.column_mask = static_cast<const int32_t*>(m.data);
    p.column_mask_stride = {m.stride[0], m.stride[2], m.stride[1]};
    p.column_mask_intervals = static_cast<int>(m.shape[3] / 2);
    p.column_mask_per_head = m.shape[1] == hq && hq > 1;
  }
  // Varlen: check_cu_seqlens below holds every sequence to the maxima the fold relies on.
  fold_unbounded_window(p);

  const bool noop = batch == 0 || hq == 0 || (varlen ? q.shape[0] == 0 : sq == 0);
  if (noop) return false;
  if (d < 1 || d > kMaxHeadDim)
    fail(ErrorCode::kUnsupported, "head_dim", "got " + std::to_string(d) + "; supported: " +
                                                  (backend == Backend::kCUDA ? cuda::supported_head_dims()
                                                                             : std::string("1..256 on the CPU backend")));
  if (backend == Backend::kCUDA) {
    if (p.dtype == DType::kFloat32)
      fail(ErrorCode::kUnsupported, "q", "the CUDA backend supports fp16 and bf16; got fp32 (use the CPU backend)");
    if (!cuda::supports_head_dim(p.head_dim))
      fail(ErrorCode::kUnsupported, "head_dim", "got " + std::to_string(d) + "; the CUDA backend supports " +
                                                    cuda::supported_head_dims());
    if (batch > kCudaMaxGridYZ)
      fail(ErrorCode::kUnsupported, varlen ? "cu_seqlens_q" : "q",
           "batch of " + std::to_string(batch) + " sequences; the CUDA backend runs at most " +
               std::to_string(kCudaMaxGridYZ) + " per call (split the batch)");
    if (hq > kCudaMaxGridYZ)
      fail(ErrorCode::kUnsupported, "q", std::to_string(hq) + " heads; the CUDA backend runs at most " +
                                             std::to_string(kCudaMaxGridYZ) + " per call");
    // The kernels address a page's rows in 32 bits.
    constexpr int64_t kMaxPageRows = std::numeric_limits<int32_t>::max();
    if (paged && (page_size % kCudaPageRows != 0 || page_size > kMaxPageRows))
      fail(ErrorCode::kUnsupported, "k",
           "pages of " + std::to_string(page_size) + " rows; the CUDA backend reads paged K/V in pages of a multiple of " +
               std::to_string(kCudaPageRows) + " rows, below 2^31");
    check_cuda_alignment(q, "q");
    check_cuda_alignment(k, "k");
    check_cuda_alignment(v, "v");
    if (out) check_cuda_alignment(*out, "out");
  }
  // The forward writes out and lse, the backward reads them. (A call without query rows, returned
  // above, has no out or lse elements; its backward zeroes dk and dv, make_bwd_params.)
  if (!backward) {
    if (out) check_written(*out, "out");
    if (!lse.empty()) check_written(lse, "lse");
    check_apart({out ? named(*out, "out") : Named{}, named(lse, "lse")},
                {named(q, "q"), named(k, "k"), named(v, "v"), named(opt.cu_seqlens_q, "cu_seqlens_q"),
                 named(opt.cu_seqlens_k, "cu_seqlens_k"), named(opt.seqused_k, "seqused_k"),
                 named(opt.block_table, "block_table"), named(opt.column_mask, "column_mask")});
  }
  if (varlen) {
    // A caller's check (check_cu_seqlens) saves the device-to-host copy of the offsets per call.
    // Host offsets cost nothing to read, so they are checked anyway (against max_seqlen: a
    // sequence longer than it would run past the kernels' bounds), and the rows the caller gave
    // must be theirs.
    const bool caller_checked = opt.checked_rows_q >= 0 && opt.checked_rows_k >= 0;
    const bool on_device = backend == Backend::kCUDA &&
                           (opt.check_on_device || cuda::stream_capturing(device.index, opt.stream));
    if (on_device) {
      // Nothing read here: the kernels keep each sequence inside the packed tensors (offsets are
      // int32, so paged keys' offsets reach at most its range), and the device check after them
      // does the host's checks (Options::check_on_device).
      constexpr int64_t kOffsetRange = std::numeric_limits<int32_t>::max();
      p.varlen_rows_q = std::min(q.shape[0], kOffsetRange);
      p.varlen_rows_k = paged ? kOffsetRange : std::min(k.shape[0], kOffsetRange);
      p.offsets_on_device = true;
    } else if (caller_checked && backend == Backend::kCUDA) {
      // Checked by the caller: only what needs no read of the offsets.
      const auto within = [](int64_t rows, const char* name, int64_t packed_rows, const char* tensor) {
        if (rows > packed_rows)
          fail(ErrorCode::kShapeMismatch, name,
               "is " + std::to_string(rows) + ", past the packed " + tensor + "'s " + std::to_string(packed_rows) +
                   " rows");
        return rows;
      };
      p.varlen_rows_q = within(opt.checked_rows_q, "checked_rows_q", q.shape[0], "q");
      // Paged keys are rows of pages, not of k: their offsets' rows bound nothing in k.
      p.varlen_rows_k = paged ? opt.checked_rows_k : within(opt.checked_rows_k, "checked_rows_k", k.shape[0], "k");
    } else {
      p.varlen_rows_q =
          check_cu_seqlens(opt.cu_seqlens_q, /*keys=*/false, batch, q.shape[0], sq, backend, device, opt.stream);
      std::vector<int32_t> offsets_k;
      p.varlen_rows_k = check_cu_seqlens(opt.cu_seqlens_k, /*keys=*/true, batch,
                                         paged ? std::numeric_limits<int64_t>::max() : k.shape[0], sk, backend,
                                         device, opt.stream, &offsets_k);
      if (paged)
        check_block_table_pages(opt.block_table, offsets_k, page_size, num_pages, backend, device, opt.stream);
      if (caller_checked) {
        const auto same = [](int64_t given, const char* name, int64_t rows, const char* offsets) {
          if (given != rows)
            fail(ErrorCode::kInvalidArgument, name,
                 "is " + std::to_string(given) + " but " + offsets + " ends at " + std::to_string(rows) +
                     " (the offsets changed since their check?)");
        };
        same(opt.checked_rows_q, "checked_rows_q", p.varlen_rows_q, "cu_seqlens_q");
        same(opt.checked_rows_k, "checked_rows_k", p.varlen_rows_k, "cu_seqlens_k");
      }
    }
    p.cu_seqlens_q = static_cast<const int32_t*>(opt.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const int32_t*>(opt.cu_seqlens_k.data);
    p.seqused_k = static_cast<const int32_t*>(opt.seqused_k.data);  // null when not given
    if (paged) {
      p.block_table = static_cast<const int32_t*>(opt.block_table.data);
      p.block_table_stride = table_row_stride(opt.block_table);
      p.block_table_cols = opt.block_table.shape[1];
      p.page_size = page_size;
      p.num_pages = num_pages;
    }
    // No sequence is longer than the rows its offsets span, so a max_seqlen above them (flash_attn
    // takes any bound, e.g. a model's context length) comes down to them: the kernels' grids and
    // the CPU backend's task list are sized by the maxima (a max_seqlen_q of 2^40 ran for hours).
    p.seqlen_q = std::min(p.seqlen_q, p.varlen_rows_q);
    p.seqlen_k = std::min(p.seqlen_k, p.varlen_rows_k);
    fold_unbounded_window(p);
  }
  return true;
}

}  // namespace

Backend choose_backend(Backend requested, const Device& device) {
  const bool on_gpu = device.type == DeviceType::kCUDA;
  switch (requested) {
    case Backend::kAuto: break;
    case Backend::kCPU:
      if (on_gpu) fail(ErrorCode::kDeviceMismatch, "backend", "cpu was requested but the tensors are on a CUDA device");
      break;
    case Backend::kCUDA:
      if (!on_gpu) fail(ErrorCode::kDeviceMismatch, "backend", "cuda was requested but the tensors are in host memory");
      break;
  }
  if (on_gpu && !cuda::available())
    fail(ErrorCode::kBackendUnavailable, "backend",
         "the tensors are on a CUDA device but this build has no CUDA backend or no GPU is visible");
  return on_gpu ? Backend::kCUDA : Backend::kCPU;
}

int64_t check_offsets(const TensorView& cu, bool keys, int64_t max_seqlen, int64_t packed_rows, void* stream) {
  const char* name = keys ? "cu_seqlens_k" : "cu_seqlens_q";
  const char* max_name = keys ? "max_seqlen_k" : "max_seqlen_q";
  check_cu_tensor(cu, name, cu.device);
  if (max_seqlen < 0) fail(ErrorCode::kInvalidArgument, max_name, "must be >= 0");
  const Backend backend = choose_backend(Backend::kAuto, cu.device);
  return check_cu_seqlens(cu, keys, cu.shape[0] - 1, packed_rows, max_seqlen, backend, cu.device, stream);
}

bool make_fwd_params(const ForwardArgs& a, FwdParams& p, Backend& backend) {
  return fill_common(a.q, a.k, a.v, &a.out, a.lse, a.options, /*backward=*/false, p, backend);
}

bool make_bwd_params(const BackwardArgs& a, BwdParams& p, Backend& backend) {
  p = BwdParams{};
  FwdParams& base = p;
  const bool work = fill_common(a.q, a.k, a.v, &a.out, a.lse, a.options, /*backward=*/true, base, backend);
  const bool varlen = !a.options.cu_seqlens_q.empty();
  const int rank = varlen ? 3 : 4;
  const char* layout = varlen ? "[total_tokens, heads, head_dim]" : "[batch, seqlen, heads, head_dim]";
  struct Grad {
    const TensorView& t;
    const char* name;
    const TensorView& like;
    const char* like_name;
    bool written;
  };
  const Grad grads[] = {{a.dout, "dout", a.q, "q", false},
                        {a.dq, "dq", a.q, "q", true},
                        {a.dk, "dk", a.k, "k", true},
                        {a.dv, "dv", a.v, "v", true}};
  for (const Grad& g : grads) {
    check_tensor(g.t, g.name, rank, layout);
    check_same_shape(g.t, g.name, g.like, g.like_name);
    check_dtype(g.t, g.name, a.q.dtype, "q");
    check_device(g.t, g.name, a.q.device);
    // A call without query rows still writes dk and dv (zeros: attention.cpp).
    if (g.written) check_written(g.t, g.name);
  }
  const Options& o = a.options;
  check_apart({named(a.dq, "dq"), named(a.dk, "dk"), named(a.dv, "dv"),
               {bytes_of(a.workspace, a.workspace_bytes), "workspace"}},
              {named(a.dout, "dout"), named(a.q, "q"), named(a.k, "k"), named(a.v, "v"), named(a.out, "out"),
               named(a.lse, "lse"), named(o.cu_seqlens_q, "cu_seqlens_q"), named(o.cu_seqlens_k, "cu_seqlens_k"),
               named(o.column_mask, "column_mask")});
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  p.do_stride = strides_of(a.dout, varlen);
  p.dq_stride = strides_of(a.dq, varlen);
  p.dk_stride = strides_of(a.dk, varlen);
  p.dv_stride = strides_of(a.dv, varlen);
  p.deterministic = a.deterministic;
  p.workspace = a.workspace;
  p.workspace_bytes = a.workspace_bytes;
  if (work && backend == Backend::kCUDA)
    for (const Grad& g : grads) check_cuda_alignment(g.t, g.name);
  return work;
}

// append_kv (kv_cache.h): the caches and the new tokens as [batch or page, row, head, dim]
// operands of one dtype, the int32 vectors and table by their own rules. Reads no tensor data.
bool make_append_params(const AppendKvArgs& a, AppendParams& p, Backend& backend) {
  constexpr const char* kOnCachesDevice = "must be on k_cache's device";
  p = AppendParams{};
  const bool paged = !a.block_table.empty();
  const char* cache_layout = paged ? "[num_pages, page_size, heads, head_dim] (paged by block_table)"
                                   : "[batch, seqlen_cache, heads, head_dim]";
  check_tensor(a.k_cache, "k_cache", 4, cache_layout);
  check_tensor(a.v_cache, "v_cache", 4, cache_layout);
  check_tensor(a.k, "k", 4, "[batch, seqlen_new, heads, head_dim]");
  check_tensor(a.v, "v", 4, "[batch, seqlen_new, heads, head_dim]");
  check_same_shape(a.v_cache, "v_cache", a.k_cache, "k_cache");
  check_same_shape(a.v, "v", a.k, "k");
  const Device device = a.k_cache.device;
  for (const auto& [t, name] : {std::pair{&a.v_cache, "v_cache"}, {&a.k, "k"}, {&a.v, "v"}}) {
    check_dtype(*t, name, a.k_cache.dtype, "k_cache");
    if (t->device != device) fail(ErrorCode::kDeviceMismatch, name, kOnCachesDevice);
  }
  const int64_t batch = a.k.shape[0];
  if (a.k.shape[2] != a.k_cache.shape[2] || a.k.shape[3] != a.k_cache.shape[3])
    fail(ErrorCode::kShapeMismatch, "k", "shape " + shape_str(a.k) + " must match k_cache's heads and head_dim " +
                                             shape_str(a.k_cache));
  if (!paged && a.k_cache.shape[0] != batch)
    fail(ErrorCode::kShapeMismatch, "k_cache", "holds " + std::to_string(a.k_cache.shape[0]) +
                                                   " sequences' caches, k " + std::to_string(batch));
  // The int32 vectors of one entry per sequence.
  for (const auto& [t, name] : {std::pair{&a.cache_seqlens, "cache_seqlens"}, {&a.status, "status"}}) {
    if (t->rank != 1 || t->shape[0] != batch)
      fail(ErrorCode::kShapeMismatch, name, "must be a 1-D int32 tensor of " + std::to_string(batch) +
                                                " entries, one per sequence, got " + shape_str(*t));
    check_int32_tensor(*t, name, batch > 0, device, kOnCachesDevice);
    if (batch > 1 && t->stride[0] != 1) fail(ErrorCode::kLayout, name, "must be contiguous");
  }
  if (paged) {
    const TensorView& table = a.block_table;
    if (table.rank != 2 || table.shape[0] != batch || table.shape[1] < 1)
      fail(ErrorCode::kShapeMismatch, "block_table",
           "must be an int32 [" + std::to_string(batch) + ", pages] tensor (at least one column), got " +
               shape_str(table));
    check_int32_tensor(table, "block_table", batch > 0, device, kOnCachesDevice);
    if (table.shape[1] > 1 && table.stride[1] != 1)
      fail(ErrorCode::kLayout, "block_table", "each row's entries must be contiguous");
  }
  backend = choose_backend(a.backend, device);
  for (const auto& [t, name] : {std::pair{&a.k_cache, "k_cache"}, {&a.v_cache, "v_cache"}, {&a.status, "status"}})
    check_written(*t, name);
  check_apart({named(a.k_cache, "k_cache"), named(a.v_cache, "v_cache"), named(a.status, "status")},
              {named(a.k, "k"), named(a.v, "v"), named(a.cache_seqlens, "cache_seqlens"),
               named(a.block_table, "block_table")});
  if (batch == 0) return false;  // nothing to write or report
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (batch > kMaxInt || a.k.shape[1] > kMaxInt || a.k.shape[2] > kMaxInt || a.k.shape[3] > kMaxInt)
    fail(ErrorCode::kShapeMismatch, "k", "sizes must fit int32, got " + shape_str(a.k));
  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.k_cache_stride = strides_of(a.k_cache, false);
  p.v_cache_stride = strides_of(a.v_cache, false);
  p.k_stride = strides_of(a.k, false);
  p.v_stride = strides_of(a.v, false);
  p.cache_seqlens = static_cast<const int32_t*>(a.cache_seqlens.data);
  p.status = static_cast<int32_t*>(a.status.data);
  p.page_size = a.k_cache.shape[1];
  p.num_pages = a.k_cache.shape[0];
  p.positions = p.page_size;
  if (paged) {
    p.block_table = static_cast<const int32_t*>(a.block_table.data);
    p.block_table_stride = table_row_stride(a.block_table);
    p.positions = a.block_table.shape[1] * p.page_size;
  }
  p.dtype = a.k_cache.dtype;
  p.batch = static_cast<int>(batch);
  p.new_tokens = static_cast<int>(a.k.shape[1]);
  p.heads = static_cast<int>(a.k.shape[2]);
  p.head_dim = static_cast<int>(a.k.shape[3]);
  p.stream = a.stream;
  p.device_index = device.index;
  return true;
}

// merge_attention (merge.h): both outputs in forward()'s dense or varlen layout, both LSEs in its
// matching one. Reads no tensor data.
bool make_merge_params(const MergeArgs& a, MergeParams& p, Backend& backend) {
  p = MergeParams{};
  constexpr int kDenseRank = 4, kVarlenRank = 3;
  if (a.out.rank != kDenseRank && a.out.rank != kVarlenRank)
    fail(ErrorCode::kShapeMismatch, "out",
         "expected rank 4 [batch, seqlen, heads, head_dim] or rank 3 [total, heads, head_dim], got rank " +
             std::to_string(a.out.rank));
  const bool varlen = a.out.rank == kVarlenRank;
  const int rank = a.out.rank;
  const char* layout = varlen ? "[total, heads, head_dim]" : "[batch, seqlen, heads, head_dim]";
  const char* lse_layout = varlen ? "[heads, total]" : "[batch, heads, seqlen]";
  check_tensor(a.out, "out", rank, layout);
  check_tensor(a.part_out, "part_out", rank, layout);
  check_tensor(a.lse, "lse", rank - 1, lse_layout, false);
  check_tensor(a.part_lse, "part_lse", rank - 1, lse_layout, false);
  check_same_shape(a.part_out, "part_out", a.out, "out");
  const int64_t batch = varlen ? 1 : a.out.shape[0], seqlen = a.out.shape[rank - 3], heads = a.out.shape[rank - 2];
  for (const auto& [t, name] : {std::pair{&a.lse, "lse"}, {&a.part_lse, "part_lse"}}) {
    const bool fits = varlen ? t->shape[0] == heads && t->shape[1] == seqlen
                             : t->shape[0] == batch && t->shape[1] == heads && t->shape[2] == seqlen;
    if (!fits)
      fail(ErrorCode::kShapeMismatch, name,
           "shape " + shape_str(*t) + " must be " +
               (varlen ? "[" + std::to_string(heads) + ", " + std::to_string(seqlen) + "]"
                       : "[" + std::to_string(batch) + ", " + std::to_string(heads) + ", " + std::to_string(seqlen) +
                             "]") +
               ", out's " + lse_layout);
    if (t->dtype != DType::kFloat32)
      fail(ErrorCode::kDtypeMismatch, name, std::string("dtype ") + dtype_name(t->dtype) + " must be fp32");
  }
  for (const auto& [t, name] : {std::pair{&a.out, "out"}, {&a.part_out, "part_out"}})
    if (t->dtype != DType::kFloat32 && t->dtype != DType::kFloat16 && t->dtype != DType::kBFloat16)
      fail(ErrorCode::kDtypeMismatch, name, std::string("dtype ") + dtype_name(t->dtype) + " is not fp32, fp16 or bf16");
  const Device device = a.out.device;
  for (const auto& [t, name] : {std::pair{&a.lse, "lse"}, {&a.part_out, "part_out"}, {&a.part_lse, "part_lse"}})
    if (t->device != device) fail(ErrorCode::kDeviceMismatch, name, "must be on out's device");
  backend = choose_backend(a.backend, device);
  check_written(a.out, "out");
  check_written(a.lse, "lse");
  // The parts may be out and lse themselves (each element then reads itself before it is written).
  check_apart({named(a.out, "out"), named(a.lse, "lse")},
              {same_view(a.part_out, a.out) ? Named{} : named(a.part_out, "part_out"),
               same_view(a.part_lse, a.lse) ? Named{} : named(a.part_lse, "part_lse")});
  if (batch == 0 || seqlen == 0 || heads == 0) return false;  // no row (head_dim 0 still merges the LSEs)
  p.out = a.out.data;
  p.part_out = a.part_out.data;
  p.lse = static_cast<float*>(a.lse.data);
  p.part_lse = static_cast<const float*>(a.part_lse.data);
  p.out_stride = strides_of(a.out, varlen);
  p.part_stride = strides_of(a.part_out, varlen);
  // An LSE's (batch, row, head) strides: dense [B, H, S], varlen [H, total].
  const auto lse_strides = [&](const TensorView& t) -> OperandStrides {
    return varlen ? OperandStrides{0, t.stride[1], t.stride[0]} : OperandStrides{t.stride[0], t.stride[2], t.stride[1]};
  };
  p.lse_stride = lse_strides(a.lse);
  p.part_lse_stride = lse_strides(a.part_lse);
  p.out_dtype = a.out.dtype;
  p.part_dtype = a.part_out.dtype;
  p.batch = batch;
  p.seqlen = seqlen;
  p.heads = heads;
  p.head_dim = a.out.shape[rank - 1];
  p.num_threads = a.num_threads;
  p.stream = a.stream;
  p.device_index = device.index;
  return true;
}

}  // namespace fusedattn::detail
