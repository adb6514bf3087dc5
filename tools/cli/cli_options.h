// The command line: GNU long flags (--flag=value or --flag value), parsed into CliArgs, then
// resolved against the backend's defaults into the RunConfig the tool executes.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedattn/attention.h"

namespace fusedattn::cli {

// Memory order of q/k/v/out: flash_attn's (batch, seq, heads, dim) or (batch, heads, seq, dim).
enum class Layout { kBSHD, kBHSD };
const char* layout_name(Layout layout);

// A command line the tool cannot accept: main prints the message and the usage, exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr uint64_t kDefaultSeed = 20240601;
constexpr int64_t kDefaultCheckRows = 64;
// The most elements a workload tensor may hold (2^60): its offsets and its size in bytes (4-byte
// elements at most) stay int64 products.
constexpr double kMaxElements = 1152921504606846976.0;

// What was given; anything unset takes the chosen backend's default in resolve().
struct CliArgs {
  std::optional<int64_t> batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
  std::optional<double> softmax_scale;  // a float's value
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  std::optional<DType> dtype;
  Layout layout = Layout::kBSHD;
  Backend backend = Backend::kAuto;
  std::optional<int64_t> iters, warmup;
  bool backward = false;
  bool deterministic = false;
  int64_t threads = 0;
  uint64_t seed = kDefaultSeed;
  int64_t check_rows = kDefaultCheckRows;
  bool peers_naive = false;
  int64_t page_size = 0;  // 0: K/V dense
  std::vector<int64_t> documents;  // --documents: lengths of the documents packed in each sequence
  bool help = false;
};

// Everything one run needs, every value decided.
struct RunConfig {
  Backend backend = Backend::kCPU;  // kCPU or kCUDA, never kAuto
  int batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  int64_t seqlen_q = 0, seqlen_k = 0;
  // --softmax-scale (a float's value, passed to the library as Options::softmax_scale); unset:
  // the library's default, 1/sqrt(head_dim).
  std::optional<double> scale;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kBSHD;
  int iters = 0, warmup = 0;
  bool backward = false;
  // The backward in deterministic mode (BackwardArgs::deterministic); the run repeats its checked
  // call and compares dq, dk and dv bit for bit.
  bool deterministic = false;
  int threads = 0;  // host threads: the CPU backend's, the check's and the naive peer's
  uint64_t seed = kDefaultSeed;
  int64_t check_rows = 0;
  bool peers_naive = false;
  // > 0: the forward reads K and V as pages of this many rows through a block table (a
  // variable-length call of batch sequences, as a paged KV cache is read; workload.h).
  int64_t page_size = 0;
  // Non-empty: each sequence packs documents of these lengths (adding up to seqlen_q = seqlen_k),
  // and a query row sees only the keys of its own document, on top of causal / the window; the
  // library gets it as a column mask (Options::column_mask; workload.h).
  std::vector<int64_t> documents;

  bool on_device() const { return backend == Backend::kCUDA; }
  // The document that holds row (or key) i: [start, end). The whole sequence without --documents.
  struct Span {
    int64_t start, end;
  };
  Span document_of(int64_t i) const;
  bool paged() const { return page_size > 0; }
  // Rows of K/V per sequence as stored: seqlen_k, rounded up to whole pages when paged.
  int64_t stored_seqlen_k() const;
  // The scale the run's softmax uses: --softmax-scale, or 1/sqrt(head_dim).
  double softmax_scale() const;
  // Elements of q (and out, dout, dq) and of k (and v, dk, dv), in double: the products may
  // pass int64 before resolve() bounds them.
  double q_elements() const;
  double kv_elements() const;
  // "B1 H8/8 Sq1024 Sk1024 D64"
  std::string shape_str() const;
  // "none", "causal", "window(128,0)", "causal+window(128,0)", each + "+docs(N)" with documents
  std::string mask_str() const;
  // "dense", or "paged(128)": how K/V are read
  std::string kv_str() const;
};

// Throws UsageError for an unknown flag, a missing or malformed value, or a value out of range.
CliArgs parse_args(int argc, const char* const* argv);

// Picks the backend (auto: CUDA when fusedattn::cuda_available()) and fills the defaults: a
// workload that runs in seconds on 2 CPU cores, or a bigger one on a GPU.
RunConfig resolve(const CliArgs& args, bool cuda_available);

std::string usage();

}  // namespace fusedattn::cli
