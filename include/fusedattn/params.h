// The torch-free parameter block every backend consumes: pointers, int64 strides in elements,
// sizes, and the mask folded into one window. Built once by the API layer after validation, so
// kernels never re-check arguments and never see Options or TensorView.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fusedattn/tensor.h"

namespace fusedattn {

// Strides of one [batch, row, head, dim] operand. For varlen operands batch_stride is 0 and the
// row of sequence b starts at cu_seqlens[b].
struct OperandStrides {
  int64_t batch = 0;
  int64_t row = 0;
  int64_t head = 0;
};

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // may be null: the caller did not ask for it
  OperandStrides q_stride, k_stride, v_stride, o_stride;
  int64_t lse_batch_stride = 0;  // 0 for varlen (rows are then indexed by cu_seqlens_q)
  int64_t lse_head_stride = 0;
  int64_t lse_row_stride = 1;    // 1 but in a grouped decode view (decode_groups_as_rows)

  DType dtype = DType::kFloat16;
  int batch = 0;     // number of sequences
  int heads_q = 0;
  int heads_kv = 0;  // heads_q % heads_kv == 0
  int head_dim = 0;
  int64_t seqlen_q = 0;  // dense: the length; varlen: max_seqlen_q, at most varlen_rows_q
  int64_t seqlen_k = 0;  // likewise, at most varlen_rows_k
  const int32_t* cu_seqlens_q = nullptr;  // varlen only, on the tensors' device
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;  // varlen forward only, optional: keys in use per sequence
  // Paged K/V (varlen forward only, Options::block_table): k/v are [num_pages, page_size, Hkv, D]
  // (k_stride.batch / v_stride.batch step from page to page) and key j of sequence b is row
  // j % page_size of page block_table[b * block_table_stride + j / page_size]; cu_seqlens_k's
  // starts index no rows then. Null: K/V rows are packed or dense as usual.
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int64_t block_table_cols = 0;  // entries per sequence's row: a sequence's keys reach no further
  int64_t page_size = 0;
  int64_t num_pages = 0;
  // Column-sparse mask (Options::column_mask; dense calls, both backends): the masked query rows of
  // key j of batch b, head h are [m[0], m[1]) and, when column_mask_intervals is 2, [m[2], m[3]),
  // where m = column_mask + b * column_mask_stride.batch + (h or 0) * .head + j * .row. Null: none.
  const int32_t* column_mask = nullptr;
  OperandStrides column_mask_stride;
  int column_mask_intervals = 0;  // 1 or 2
  bool column_mask_per_head = false;  // false: one mask head shared by every query head
  // Varlen only: the packed rows the sequences use, cu_seqlens_q/k[batch] (validation reads them);
  // rows past these (a packed tensor may be longer) are never read. Offsets checked on the device
  // (offsets_on_device) are not read on the host: these are then the packed tensors' rows (paged
  // keys: the int32 range), and seq_info() keeps every sequence inside them whatever the offsets.
  int64_t varlen_rows_q = 0;
  int64_t varlen_rows_k = 0;
  // Varlen CUDA calls only: the offsets (and the table's entries in use) are checked by a kernel
  // after the attention kernels, which records the first fault (check_device_errors()) and
  // poisons the call's outputs with NaN (Options::check_on_device; CUDA graph captures).
  bool offsets_on_device = false;

  // A variable-length decode viewed as rows (decode_groups_as_rows with strided rows): each
  // packed query row holds view_group rows of the view, its query heads of one KV head. The
  // packed row a sequence starts at then steps q and o by q/o_packed_row_stride, and its rows in
  // the view by q/o_stride.row (the query head stride). 1 and unused otherwise.
  int view_group = 1;
  int64_t q_packed_row_stride = 0, o_packed_row_stride = 0;

  float scale = 0.f;       // softmax scale
  float scale_log2 = 0.f;  // scale * log2(e): kernels use exp2
  // Window after folding causal in (causal => window_right = 0); -1 = unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  bool is_masked() const { return window_left >= 0 || window_right >= 0 || column_mask != nullptr; }

  Device device{};
  void* stream = nullptr;
  int num_threads = 0;
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  OperandStrides do_stride, dq_stride, dk_stride, dv_stride;
  bool deterministic = false;
  void* workspace = nullptr;  // backend scratch, backward_workspace_bytes() long
  std::size_t workspace_bytes = 0;
};

#if defined(__CUDACC__)
#define FUSEDATTN_HD __host__ __device__ __forceinline__
#else
#define FUSEDATTN_HD inline
#endif

// Element offset of (batch b, row, head h) in an operand with strides s.
FUSEDATTN_HD int64_t element_offset(const OperandStrides& s, int64_t b, int64_t row, int64_t h) {
  return b * s.batch + row * s.row + h * s.head;
}

// Per-sequence lengths and offsets, the same rule on every backend.
struct SeqInfo {
  int64_t q_start, k_start;  // first row of sequence b in the packed tensor (0 for dense)
  int64_t len_q, len_k;
};

// The keys sequence b of a variable-length batch attends to: its cu_seqlens_k rows, or the first
// seqused_k[b] of them, clamped to [0, rows] (the entry is never checked on the host).
FUSEDATTN_HD int64_t used_keys(const FwdParams& p, int b, int64_t rows) {
  if (p.seqused_k == nullptr) return rows;
  const int64_t used = p.seqused_k[b];
  return used < 0 ? 0 : (used < rows ? used : rows);
}

FUSEDATTN_HD int64_t clamp_to(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x < hi ? x : hi); }

// Sequence b's rows of a packed tensor: [start, end) from its offsets, kept inside [0, rows] and
// never ending before they start. Offsets that passed their check are unchanged by this; others
// (checked on the device, or changed since their check) can then make no kernel read or write
// outside the tensor.
struct PackedRange {
  int64_t start, end;
};
FUSEDATTN_HD PackedRange packed_range(const int32_t* cu_seqlens, int b, int64_t rows) {
  const int64_t start = clamp_to(cu_seqlens[b], 0, rows);
  return {start, clamp_to(cu_seqlens[b + 1], start, rows)};
}

// The most keys sequence b may have: max_seqlen_k, and for paged K/V what its table row reaches.
FUSEDATTN_HD int64_t key_bound(const FwdParams& p) {
  if (p.block_table == nullptr) return p.seqlen_k;
  const int64_t reach = p.block_table_cols * p.page_size;
  return reach < p.seqlen_k ? reach : p.seqlen_k;
}

// cu_seqlens (and seqused_k) must be readable where this runs (host memory for the CPU backend).
// A sequence longer than max_seqlen_q/k (never after the host's check) is cut to it, so that no
// grid or workspace sized by the maxima is overrun.
FUSEDATTN_HD SeqInfo seq_info(const FwdParams& p, int b) {
  if (p.cu_seqlens_q == nullptr) return {0, 0, p.seqlen_q, p.seqlen_k};
  const PackedRange q = packed_range(p.cu_seqlens_q, b, p.varlen_rows_q);
  const PackedRange k = packed_range(p.cu_seqlens_k, b, p.varlen_rows_k);
  const int64_t rows_q = (q.end - q.start) * p.view_group;
  const int64_t len_q = rows_q < p.seqlen_q ? rows_q : p.seqlen_q;
  const int64_t bound = key_bound(p);
  return {q.start, k.start, len_q, used_keys(p, b, k.end - k.start < bound ? k.end - k.start : bound)};
}

// Paged K/V (block_table set): the page in column `column` of sequence b's table row, and the
// page holding its key j. An entry outside [0, num_pages) is clamped into it: validation checks
// the pages a sequence's keys reach on the host, unless the caller vouched for the offsets
// (Options::checked_rows_q/k) or the device checks them (offsets_on_device), and no table may
// make a backend read outside k and v. seq_info() keeps a sequence's keys within its row.
FUSEDATTN_HD int64_t table_page(const FwdParams& p, int b, int64_t column) {
  const int64_t page = p.block_table[b * p.block_table_stride + column];
  return page < 0 ? 0 : (page < p.num_pages ? page : p.num_pages - 1);
}
FUSEDATTN_HD int64_t key_page(const FwdParams& p, int b, int64_t j) { return table_page(p, b, j / p.page_size); }

// Whether a KV block that holds a sequence's last keys may go on into rows the caller never wrote:
// seqused_k's unused cache rows, a page's rows past its sequence's keys. A kernel that loads
// whole blocks masks their scores, but must zero their V rows (P V's 0 * NaN is NaN).
FUSEDATTN_HD bool loads_unwritten_rows(const FwdParams& p) { return p.seqused_k != nullptr || p.block_table != nullptr; }

// Column masks (column_mask set): the mask head that query head h reads (one shared head unless
// the mask is per head), how many mask heads there are, and key 0's bounds for (batch b, query
// head h); key j's lie j * column_mask_stride.row further.
FUSEDATTN_HD int column_mask_head(const FwdParams& p, int h) { return p.column_mask_per_head ? h : 0; }
FUSEDATTN_HD int column_mask_heads(const FwdParams& p) { return p.column_mask_per_head ? p.heads_q : 1; }
FUSEDATTN_HD const int32_t* column_mask_keys(const FwdParams& p, int b, int h) {
  return p.column_mask + b * p.column_mask_stride.batch + column_mask_head(p, h) * p.column_mask_stride.head;
}

// The keys query row i (0-based within its sequence) may see: [lo, hi], empty when lo > hi.
// Windows are aligned to the bottom-right corner: row i lines up with key i + len_k - len_q.
struct KeyRange {
  int64_t lo, hi;
};
FUSEDATTN_HD KeyRange key_range(const FwdParams& p, int64_t i, int64_t len_q, int64_t len_k) {
  const int64_t diag = i + len_k - len_q;
  int64_t lo = p.window_left >= 0 ? diag - p.window_left : 0;
  int64_t hi = p.window_right >= 0 ? diag + p.window_right : len_k - 1;
  if (lo < 0) lo = 0;
  if (hi > len_k - 1) hi = len_k - 1;
  return {lo, hi};
}

// A window side that excludes no key of any row is no bound at all: row i's diagonal key is
// i + Sk - Sq, so every row sees all keys to its left when left >= Sk - 1 (the last row's
// diagonal) and all to its right when right >= Sq - 1 (the first row's); for a variable-length
// batch the maxima (seqlen_q/k) bound every sequence's. The API folds such sides to -1, which
// keeps each backend's row +/- window arithmetic far from int64 overflow and lets dispatch take
// the unmasked kernels (a decode step's causal mask: one query that sees its whole cache).
inline void fold_unbounded_window(FwdParams& p) {
  const int64_t last_diagonal = p.seqlen_k > 0 ? p.seqlen_k - 1 : 0;
  const int64_t last_row = p.seqlen_q > 0 ? p.seqlen_q - 1 : 0;
  if (p.window_left >= last_diagonal) p.window_left = -1;
  if (p.window_right >= last_row) p.window_right = -1;
}

// Decoding with grouped heads: one query row per sequence and g query heads per KV head. Run as
// is, each of the g heads reads the whole K/V of its KV head, so the group's K/V is read g times.
// Viewed as g rows of one head (a group's query heads are consecutive, so the head stride steps
// from row to row), it is read once. Exact where every row sees the same keys: a full mask,
// which a causal mask of one query row folds into (fold_unbounded_window). FlashAttention-2
// swaps the same way for its dense decode. The backends' forwards apply it (the CPU backend, the
// portable CUDA kernels); anything else is returned as it is.
// A backend that reads q/o_row_offset, lse_row_stride and view_group (strided_rows: the portable
// CUDA forward) also takes any LSE layout and variable-length batches of at most one query row
// per sequence (max_seqlen_q 1: decode steps over ragged or paged caches); the others need a
// dense batch whose LSE heads are 1 apart (a [B, H, 1] LSE), so that its rows are.
inline FwdParams decode_groups_as_rows(const FwdParams& p, bool strided_rows = false) {
  const bool dense = p.cu_seqlens_q == nullptr;
  const int group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  const bool lse_fits = p.lse == nullptr || p.lse_head_stride == 1;
  if (p.seqlen_q != 1 || group <= 1 || p.is_masked()) return p;
  if (!strided_rows && (!dense || !lse_fits)) return p;
  FwdParams rows = p;
  rows.seqlen_q = group;
  rows.heads_q = p.heads_kv;
  rows.q_stride.row = p.q_stride.head;
  rows.q_stride.head = p.q_stride.head * group;
  rows.o_stride.row = p.o_stride.head;
  rows.o_stride.head = p.o_stride.head * group;
  rows.lse_row_stride = p.lse_head_stride;
  rows.lse_head_stride = p.lse_head_stride * group;
  if (!dense) {
    rows.view_group = group;
    rows.q_packed_row_stride = p.q_stride.row;
    rows.o_packed_row_stride = p.o_stride.row;
  }
  return rows;
}

// Where row m of a sequence starting at packed row q_start (0 for dense batches) lies in q and o
// (elements from the batch's start), and in the LSE (from its head's start), under the grouped
// decode view or not.
FUSEDATTN_HD int64_t q_row_offset(const FwdParams& p, int64_t q_start, int64_t m) {
  return q_start * (p.view_group > 1 ? p.q_packed_row_stride : p.q_stride.row) + m * p.q_stride.row;
}
FUSEDATTN_HD int64_t o_row_offset(const FwdParams& p, int64_t q_start, int64_t m) {
  return q_start * (p.view_group > 1 ? p.o_packed_row_stride : p.o_stride.row) + m * p.o_stride.row;
}
FUSEDATTN_HD int64_t lse_row_offset(const FwdParams& p, int64_t q_start, int64_t m) {
  return q_start + m * p.lse_row_stride;
}

// append_kv's block (kv_cache.h), after validation.
struct AppendParams {
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  // [batch or page, row, head] strides in elements; the head dim is contiguous.
  OperandStrides k_cache_stride, v_cache_stride, k_stride, v_stride;
  const int32_t* cache_seqlens = nullptr;
  const int32_t* block_table = nullptr;  // null: per-sequence caches
  int64_t block_table_stride = 0;
  int64_t page_size = 0;   // rows per page; with no table, the caches' S_cache
  int64_t num_pages = 0;   // with no table, the batch
  int64_t positions = 0;   // a sequence's positions: S_cache, or the table's columns x page_size
  int32_t* status = nullptr;
  DType dtype = DType::kFloat16;
  int batch = 0;
  int new_tokens = 0;
  int heads = 0;
  int head_dim = 0;
  void* stream = nullptr;
  int device_index = 0;
};

// append_kv's rules, one for both backends. Whether sequence b's new tokens fit its positions
// (kPastCache otherwise), before its pages are looked at.
FUSEDATTN_HD bool append_fits(const AppendParams& p, int b) {
  const int64_t n = p.cache_seqlens[b];
  return n >= 0 && n <= p.positions - p.new_tokens;
}
// The cache row (page or sequence index) and the row within it of position `pos` of sequence b,
// or -1 where the table names no page of the pools. pos < p.positions.
struct AppendRow {
  int64_t page = -1;
  int64_t row = 0;
};
FUSEDATTN_HD AppendRow append_row(const AppendParams& p, int b, int64_t pos) {
  if (p.block_table == nullptr) return {b, pos};
  const int64_t page = p.block_table[b * p.block_table_stride + pos / p.page_size];
  if (page < 0 || page >= p.num_pages) return {};
  return {page, pos % p.page_size};
}

// merge_attention's block (merge.h), after validation. Rows are (batch, seqlen, head) triples; a
// varlen layout is one batch of `total` rows.
struct MergeParams {
  void* out = nullptr;
  const void* part_out = nullptr;
  float* lse = nullptr;
  const float* part_lse = nullptr;
  // Element strides of a row's batch, seqlen and head index, for the outputs (whose head dim is
  // contiguous) and for the LSEs (one element per row).
  OperandStrides out_stride, part_stride, lse_stride, part_lse_stride;
  DType out_dtype = DType::kFloat32;
  DType part_dtype = DType::kFloat32;
  int64_t batch = 0;
  int64_t seqlen = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int num_threads = 0;
  void* stream = nullptr;
  int device_index = 0;
};

// The weights of one row's merge, the same rule on every backend: each side's share of the
// merged softmax's mass, and the merged LSE. Taken relative to the larger LSE, so nothing
// overflows; log1p keeps the merged LSE exact where the other side's share is tiny.
struct MergeWeights {
  float lse;   // the merged LSE
  float out;   // out's weight
  float part;  // part_out's weight
};
FUSEDATTN_HD MergeWeights merge_weights(float lse, float part_lse) {
  const float no_key = -INFINITY;
  if (lse == no_key && part_lse == no_key) return {no_key, 0.0f, 0.0f};
  const bool out_larger = lse >= part_lse;  // false where either is NaN, whose NaN then spreads
  const float larger = out_larger ? lse : part_lse, smaller = out_larger ? part_lse : lse;
  const float ratio = expf(smaller - larger);  // in [0, 1]
  const float big = 1.0f / (1.0f + ratio), small = ratio * big;
  return {larger + log1pf(ratio), out_larger ? big : small, out_larger ? small : big};
}
// One merged element. A side of weight 0 (an LSE of -inf: no key) is not read into the sum, so
// whatever its output holds there stays out of the result.
FUSEDATTN_HD float merge_element(const MergeWeights& w, float out, float part) {
  return (w.out != 0.0f ? w.out * out : 0.0f) + (w.part != 0.0f ? w.part * part : 0.0f);
}

}  // namespace fusedattn
