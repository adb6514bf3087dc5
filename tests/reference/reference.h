// The test-side reference: a naive float64 implementation with materialised scores, plus a
// "plain same-dtype" implementation used for the 2x error rule, and host tensors that hold data
// in any dtype and either layout. Shared by the CPU tests, the GPU tests and the CLI's check.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/attention.h"

namespace fusedattn::testing {

// One attention problem, in the public API's terms.
struct Problem {
  int batch = 1, heads_q = 1, heads_kv = 1, head_dim = 64;
  int64_t seqlen_q = 128, seqlen_k = 128;  // dense lengths; ignored when varlen
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softmax_scale = 0.f;  // 0 = default 1/sqrt(head_dim)
  // Varlen: per-sequence lengths (batch entries each); empty for dense problems.
  std::vector<int64_t> lens_q, lens_k;
  // Varlen: the max_seqlen_q/k the call passes when above the longest sequence (0: the longest),
  // a bound such as a model's context length.
  int64_t max_seqlen_bound = 0;
  // Varlen forward: the keys each sequence uses (Options::seqused_k), clamped to [0, lens_k[b]]
  // as the library clamps them; empty: all of them.
  std::vector<int64_t> seqused_k;

  bool varlen() const { return !lens_q.empty(); }
  int64_t total_q() const;  // rows of the packed q (dense: batch * seqlen_q)
  int64_t total_k() const;
  std::vector<int32_t> cu_seqlens_q() const;
  std::vector<int32_t> cu_seqlens_k() const;
  int64_t max_seqlen_q() const;
  int64_t max_seqlen_k() const;
  float scale() const;
  std::string str() const;  // "B2 H8/2 Sq100 Sk77 D64 causal ..."
};

// Logical layout of dense q/k/v/out: kBSHD is flash_attn's, kBHSD the Triton tutorial's.
enum class Layout { kBSHD, kBHSD };

// Host values in double, always in the canonical order: dense [B, S, H, D], varlen [total, H, D];
// lse dense [B, Hq, Sq], varlen [Hq, total_q].
struct Tensors {
  std::vector<double> q, k, v, out, lse, dout, dq, dk, dv;
};

// Float64 reference with materialised scores. Fully masked rows: out 0, lse -inf.
void reference_forward(const Problem& p, Tensors& t);
// Needs t.q, t.k, t.v, t.dout; fills dq, dk, dv (dk/dv summed over a GQA group's heads).
void reference_backward(const Problem& p, Tensors& t);
// The FlashAttention backward's own float64 model: reference_backward with each row's
// delta = dO . O taken over `stored_out` (the output as the forward stored it, in its dtype) in
// place of sum_j P_ij dP_ij. What it differs from the reference by is the stored output's
// rounding carried into dS, which every kernel that reads O back shares; where each row's softmax
// is nearly one-hot (logits in the hundreds), dq and dk are little more than that.
void reference_backward_over_stored_out(const Problem& p, Tensors& t, const std::vector<double>& stored_out);

// The same computation as a plain implementation would do it in `dtype`: inputs rounded to
// dtype, S = QK^T accumulated in fp32 and rounded to dtype, softmax in fp32, P rounded to dtype,
// O = PV accumulated in fp32 and rounded to dtype (what torch's math path does in fp16/bf16).
// Its error against the float64 reference sets the bar for a kernel: err <= 2 * err_plain + atol.
void plain_forward(const Problem& p, DType dtype, Tensors& t);
void plain_backward(const Problem& p, DType dtype, Tensors& t);

// One query row (sequence b, query head h, row i within the sequence) of the forward, for checks
// that sample rows of problems too large for the full reference. Reads t.q, t.k, t.v only.
struct RowResult {
  std::vector<double> out;  // head_dim values
  double lse = 0;
};
RowResult reference_forward_row(const Problem& p, const Tensors& t, int b, int h, int64_t i);
// plain_forward_row expects t's inputs to be values of dtype already (as randn and HostTensor
// give them); unlike plain_forward it does not round them, so that sampled rows stay cheap.
RowResult plain_forward_row(const Problem& p, DType dtype, const Tensors& t, int b, int h, int64_t i);

// Canonical positions of row (b, h, i) in out (first of head_dim values) and in lse.
int64_t out_offset(const Problem& p, int b, int h, int64_t i);
int64_t lse_offset(const Problem& p, int b, int h, int64_t i);

// Rounds a double through `dtype` and back (fp16/bf16 round-to-nearest-even, fp32).
double round_to(DType dtype, double x);

// Element-wise conversions between double and a storage dtype.
void encode(DType dtype, const double* src, void* dst, int64_t n);
void decode(DType dtype, const void* src, double* dst, int64_t n);

// A host tensor of a given dtype whose memory order may differ from the canonical one (BHSD).
// `view()` gives the TensorView with the right strides for the public API.
class HostTensor {
 public:
  HostTensor() = default;
  // shape is the canonical logical shape ([B,S,H,D], [total,H,D], [B,H,S] or [H,total]).
  // With layout kBHSD and rank 4, memory is ordered [B,H,S,D] and the view's strides permuted.
  HostTensor(DType dtype, std::vector<int64_t> shape, Layout layout = Layout::kBSHD);
  TensorView view();
  // The same view over another copy of these bytes (a device buffer in the GPU tests).
  TensorView view_at(void* data, Device device) const;
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  Layout layout() const { return layout_; }
  std::size_t nbytes() const { return bytes_.size(); }
  int64_t numel() const;
  void fill(const std::vector<double>& canonical);  // canonical order in, memory order stored
  std::vector<double> to_double() const;            // memory order out as canonical order
  void poison();                                    // NaN everywhere (fp types)

 private:
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  Layout layout_ = Layout::kBSHD;
  std::vector<unsigned char> bytes_;
};

// Fresh N(mean, stddev) values, rounded through dtype so every backend sees identical inputs.
std::vector<double> randn(std::mt19937_64& rng, int64_t n, double stddev, DType dtype);

struct ErrorStats {
  double max_abs = 0;    // over finite positions; NaN/Inf mismatches count as infinite
  double rel_l2 = 0;     // ||a - ref|| / ||ref||
  int64_t mismatched_nonfinite = 0;  // positions where exactly one side is non-finite, or both
                                     // non-finite but different
};
ErrorStats compare(const std::vector<double>& got, const std::vector<double>& ref);

// The 2x rule: passes when got's max error <= 2 * plain's max error + atol, and no non-finite
// mismatch. Returns a message describing both errors (for gtest output).
bool within_2x_rule(const std::vector<double>& got, const std::vector<double>& plain,
                    const std::vector<double>& ref, double atol, std::string* message);

}  // namespace fusedattn::testing
