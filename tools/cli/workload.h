// The tensors of one run: q/k/v/out (and dout/dq/dk/dv for the backward) in the chosen layout and
// dtype, lse, in the backend's memory, each with a host copy the check reads.
#pragma once

#include <cstdint>
#include <vector>

#include "cli_options.h"
#include "device_memory.h"
#include "fusedattn/attention.h"

namespace fusedattn::cli {

// One operand with logical shape [batch, seqlen, heads, head_dim], stored in `layout` order.
class Operand {
 public:
  Operand() = default;
  Operand(DType dtype, Layout layout, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim, bool on_device);

  TensorView view() const;            // the [B, S, H, D] view the API takes, on the backend's memory
  // bshd only: the same memory as [B * S / rows, rows, H, D], i.e. packed rows (rows = S, rank 3
  // [B * S, H, D] with `packed`) or pages of `rows` rows.
  TensorView rows_view(int64_t rows, bool packed) const;
  void randomize(uint64_t seed, int threads);  // fresh N(0,1) values rounded to the dtype
  void poison();                      // NaN in the backend's memory, so an unwritten element shows
  void fetch();                       // copies the backend's memory to the host copy (no-op on CPU)
  std::vector<unsigned char> host_bytes() const;  // the host copy's bytes (after fetch())

  // The head_dim values of row (b, s, h) from the host copy, as doubles.
  void read_row(int64_t b, int64_t s, int64_t h, double* dst) const;
  DType dtype() const { return dtype_; }

 private:
  const void* host() const;
  DType dtype_ = DType::kFloat32;
  int64_t shape_[4] = {};   // logical [B, S, H, D]
  int64_t stride_[4] = {};  // element strides of the logical dimensions
  BackendBuffer buffer_;
  std::vector<unsigned char> mirror_;  // the host copy when the buffer is on the GPU
};

// lse: fp32 [batch, heads, seqlen_q], contiguous; with `packed` (a variable-length call's) [heads,
// batch * seqlen_q].
class LseTensor {
 public:
  LseTensor() = default;
  LseTensor(int64_t batch, int64_t heads, int64_t seqlen, bool on_device, bool packed = false);
  TensorView view() const;
  void poison();
  void fetch();
  double at(int64_t b, int64_t h, int64_t i) const {
    return host_[static_cast<size_t>(packed_ ? (h * batch_ + b) * seqlen_ + i : (b * heads_ + h) * seqlen_ + i)];
  }

 private:
  int64_t batch_ = 0, heads_ = 0, seqlen_ = 0;
  bool packed_ = false;
  BackendBuffer buffer_;
  std::vector<float> host_;
};

// With --page-size (RunConfig::paged) the forward is a variable-length call of batch sequences of
// seqlen_q queries and seqlen_k keys, over q and out as packed rows and k and v as pages: each
// sequence's rows of k/v, rounded up to whole pages, are its pages, so the table maps sequence b's
// page j to page b * pages_per_seq + j and the check reads k/v as the dense tensors they also are.
struct Workload {
  explicit Workload(const RunConfig& config);

  Options options() const;
  // `timed`: the calls after the checked one, which pass the offsets as checked
  // (Options::checked_rows_q/k), so that a paged call's time is the kernels' and not the host
  // read of its offsets and table.
  ForwardArgs forward_args(bool timed = false) const;
  BackwardArgs backward_args() const;  // needs the forward's out and lse

  // Random inputs; every operand gets its own stream of the seed, so results do not depend on
  // the thread count.
  void randomize();
  void poison_forward_outputs();
  void poison_backward_outputs();
  void fetch_forward_outputs();
  void fetch_backward_outputs();
  // Backward scratch sized by backward_workspace_bytes(), allocated once outside the timed loop.
  void allocate_workspace();

  RunConfig config;
  Operand q, k, v, out;
  LseTensor lse;
  Operand dout, dq, dk, dv;  // only allocated with --backward
  BackendBuffer workspace;
  BackendBuffer cu_q, cu_k, block_table;  // int32, only with --page-size
  // int32 [batch, 1, seqlen_k, kDocumentBoundsPerKey], only with --documents: key j of the
  // document [s, e) hides from query rows [0, s) and [e, seqlen_q) (Options::column_mask).
  static constexpr int64_t kDocumentBoundsPerKey = 4;
  BackendBuffer column_mask;
};

// Floating-point operations of one call by the FlashAttention convention: 4 * B * H * Sq * Sk * D
// for the forward (two matmuls), halved for causal, x2.5 for the backward (five matmuls). For
// a sliding window the exact count of visible (query, key) pairs replaces Sq * Sk.
double attention_flops(const RunConfig& config);

}  // namespace fusedattn::cli
