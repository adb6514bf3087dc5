// The public, torch-free entry points of fusedattn.
//
// Layouts (any strides, the last dimension contiguous):
//   dense:  q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D], out like q, lse fp32 [B, Hq, Sq]
//   varlen: q [total_q, Hq, D], k/v [total_k, Hkv, D], out like q, lse fp32 [Hq, total_q],
//           with int32 cu_seqlens_q/k of B+1 monotone offsets (Options) on the tensors' device.
// Semantics follow flash_attn 2.x: softmax(q k^T * scale) v with the natural-log LSE saved;
// causal and windows are aligned to the bottom-right corner when Sq != Sk; query head h reads
// KV head h / (Hq / Hkv). A fully masked query row gives out = 0 and lse = -inf.
// A tensor a call writes must not share a byte with any other tensor of the call (checked: an
// Error of kLayout names both); views of one packed buffer whose elements are disjoint are fine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fusedattn/error.h"
#include "fusedattn/tensor.h"

namespace fusedattn {

enum class Backend : int8_t { kAuto, kCPU, kCUDA };
const char* backend_name(Backend backend);

struct Options {
  std::optional<float> softmax_scale;  // default 1/sqrt(D)
  bool causal = false;
  // Sliding window: query i (bottom-right aligned) sees keys j with
  //   i + Sk - Sq - window_left <= j <= i + Sk - Sq + window_right;  -1 = unbounded on that side.
  // causal == true is the same as window_right = 0.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // Variable-length batches: both empty for dense tensors, both set for packed ones: int32
  // vectors of B+1 non-decreasing offsets starting at 0, on the tensors' device.
  TensorView cu_seqlens_q;
  TensorView cu_seqlens_k;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
  // Variable-length forward only, optional: int32 [B] on the tensors' device. Sequence b then
  // attends to the first seqused_k[b] of its cu_seqlens_k rows (flash_attn's seqused_k: KV caches
  // whose sequences fill part of their rows), its masks aligned to that length. Validation does
  // not read it (on CUDA no sync, unlike cu_seqlens): the kernels clamp each entry to [0, rows].
  TensorView seqused_k;
  // Paged K/V (variable-length forward only, as flash_attn's varlen block_table): int32
  // [B, max_pages_per_seq] on the tensors' device, rows of any stride, entries contiguous. k and v
  // are then pages [num_pages, page_size, Hkv, D], and key j of sequence b (which has the length
  // its cu_seqlens_k offsets give, or seqused_k[b]; the offsets' starts index no rows) is row
  // j % page_size of page block_table[b][j / page_size]. The pages each sequence's cu_seqlens_k
  // length reaches are checked on the host with the offsets (each in [0, num_pages)); with
  // checked_rows_q/k set on CUDA they are not read, and the kernels clamp an entry out of range
  // to it, so a bad table reads wrong pages but never outside k and v. The CUDA backend needs
  // page_size to be a multiple of kCudaPageRows; the CPU backend takes any.
  TensorView block_table;
  // Column-sparse mask (FlashMask's representation), dense calls only, on both backends (CUDA:
  // the portable kernels, and the Hopper forward at head dims 64 and 128): int32 [B, Hm, Sk, 2
  // or 4] on q's device (Hm: 1, shared by every query head, or Hq; its last dimension
  // contiguous). Key j of batch b hides itself from query rows
  // [m[b,h,j,0], m[b,h,j,1]) and, with 4 entries, from rows [m[b,h,j,2], m[b,h,j,3]) too (query
  // rows 0-based; an interval whose start is not below its end hides nothing; bounds past the
  // rows are fine). On top of causal / the window: a key is seen where both allow it. One
  // interval per key gives document masks (with causal) and prefix-LM masks (without); two give
  // e.g. a shared prefix with causal documents. Forward and backward; key tiles a query block cannot
  // see at all are skipped (docs/api.md says where on CUDA).
  TensorView column_mask;
  // The last entries of cu_seqlens_q/k as check_cu_seqlens() returned them for these exact
  // contents, or -1. Set (both), forward() and backward() on CUDA tensors skip their own check of
  // the offsets, which reads them on the host: a device-to-host copy, i.e. a sync of the stream,
  // per call. Offsets that changed since their check are the caller's error there. Host offsets
  // are always checked, and then must end at these values.
  int64_t checked_rows_q = -1;
  int64_t checked_rows_k = -1;
  // Variable-length CUDA calls: check the offsets (and block_table's entries in use) on the
  // device instead of reading them on the host, so the call never waits for the stream. A kernel
  // after the attention kernels does the host check's checks (the table's entries against each
  // sequence's used keys, seqused_k applied); a fault poisons the call's outputs (out and lse, or
  // dq, dk and dv) with NaN and is recorded for check_device_errors(), which throws it. The
  // kernels stay inside the tensors whatever the offsets hold. Implied while the call's stream is
  // being captured into a CUDA graph (a host read cannot be captured), and then checked_rows_q/k
  // are not used: each replay checks the offsets the tensors hold then. Dense calls have no
  // offsets to check; the CPU backend reads host offsets and checks them at once, as always.
  bool check_on_device = false;
  Backend backend = Backend::kAuto;  // kAuto: the tensors' device decides
  void* stream = nullptr;            // cudaStream_t for the CUDA backend; null = default stream
  int num_threads = 0;               // CPU backend threads; 0 = hardware concurrency
};

// Rows per page the CUDA kernels need paged K/V's page_size to be a multiple of (a KV tile never
// straddles two pages). flash_attn 2.x asks for multiples of 256.
constexpr int64_t kCudaPageRows = 128;

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;  // written
  TensorView lse;  // written, fp32; may be left empty when not needed
  Options options;
};

struct BackwardArgs {
  TensorView dout, q, k, v, out, lse;
  TensorView dq, dk, dv;  // written; dk/dv are summed over the query heads of a GQA group
  Options options;
  bool deterministic = false;  // bit-identical results run to run (slower on the GPU)
  // Scratch for the CUDA backend (dq accumulator, delta): backward_workspace_bytes() bytes on the
  // tensors' device. Null: the library allocates it on the stream itself.
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

void forward(const ForwardArgs& args);
void backward(const BackwardArgs& args);

// Checks cu_seqlens_q (keys == false) or cu_seqlens_k (keys == true) as forward() and backward()
// do: an int32 vector of batch + 1 offsets starting at 0, never decreasing, no sequence longer
// than max_seqlen, the last offset within the packed tensor's packed_rows. Reads the offsets on
// the host (for a CUDA tensor: a copy on `stream`, which waits for the stream). Returns the last
// offset, for Options::checked_rows_q/k of the calls that share these offsets (every layer of a
// model), which then skip the check. Throws fusedattn::Error naming cu_seqlens_q/k or
// max_seqlen_q/k.
int64_t check_cu_seqlens(const TensorView& cu_seqlens, bool keys, int64_t max_seqlen, int64_t packed_rows,
                         void* stream = nullptr);

// Waits for the CUDA device, then throws the first fault the device check of offsets
// (Options::check_on_device, CUDA graph captures) found on it since the last call, as the host
// check would have named it (kInvalidArgument or kShapeMismatch, naming cu_seqlens_q/k,
// max_seqlen_q/k or block_table), and forgets it. Returns when there was none. Not while a stream
// of the device is being captured. A CPU device has nothing to check.
void check_device_errors(const Device& device);

// Whether `stream` (a cudaStream_t; null: the default stream) of a CUDA device is being captured
// into a CUDA graph, where variable-length calls check their offsets on the device
// (Options::check_on_device). False for a CPU device.
bool stream_capturing(const Device& device, void* stream);

// Bytes of scratch the chosen backend needs for this backward call (0 for the CPU backend).
std::size_t backward_workspace_bytes(const BackwardArgs& args);

// True when this build has the CUDA backend and a usable GPU is present.
bool cuda_available();
// "CPU (N threads)" or the GPU's name.
std::string device_name(Backend backend);

}  // namespace fusedattn
