#include "cli_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace fusedattn::cli {
namespace {

// Defaults: the CPU workload finishes in a few seconds on 2 cores; the GPU one is large enough
// for the kernels to reach steady-state throughput.
struct Defaults {
  int64_t batch, heads, seqlen, head_dim, iters, warmup;
  DType dtype;
};
constexpr Defaults kCpuDefaults{1, 8, 1024, 64, 5, 1, DType::kFloat32};
constexpr Defaults kCudaDefaults{4, 16, 4096, 128, 20, 5, DType::kFloat16};

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

struct Flag {
  const char* name;     // without the leading "--"
  const char* metavar;  // null for a switch that takes no value
  const char* help;
  std::function<void(CliArgs&, std::string_view)> set;
};

int64_t parse_int(std::string_view flag, std::string_view text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError("--" + std::string(flag) + ": expected an integer, got '" + std::string(text) + "'");
  if (value < lo || value > hi)
    throw UsageError("--" + std::string(flag) + ": " + std::string(text) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return value;
}

// A finite number a float holds (the library's scale is a float), rounded to that float.
double parse_float(std::string_view flag, std::string_view text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    throw UsageError("--" + std::string(flag) + ": expected a finite number, got '" + std::string(text) + "'");
  if (std::fabs(value) > std::numeric_limits<float>::max())
    throw UsageError("--" + std::string(flag) + ": " + std::string(text) + " is beyond the float range the library takes");
  return static_cast<float>(value);
}

template <typename T>
T parse_choice(std::string_view flag, std::string_view text,
               std::initializer_list<std::pair<std::string_view, T>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    names += (names.empty() ? "" : "|") + std::string(name);
  }
  throw UsageError("--" + std::string(flag) + ": expected " + names + ", got '" + std::string(text) + "'");
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"batch", "N", "sequences per batch", [](CliArgs& a, std::string_view v) { a.batch = parse_int("batch", v, 1, kMaxInt); }},
      {"heads", "N", "query heads", [](CliArgs& a, std::string_view v) { a.heads = parse_int("heads", v, 1, kMaxInt); }},
      {"kv-heads", "N", "key/value heads (GQA/MQA); must divide --heads (default: --heads)",
       [](CliArgs& a, std::string_view v) { a.kv_heads = parse_int("kv-heads", v, 1, kMaxInt); }},
      {"seqlen-q", "N", "query length", [](CliArgs& a, std::string_view v) { a.seqlen_q = parse_int("seqlen-q", v, 1, kMaxInt); }},
      {"seqlen-k", "N", "key length (default: --seqlen-q)",
       [](CliArgs& a, std::string_view v) { a.seqlen_k = parse_int("seqlen-k", v, 1, kMaxInt); }},
      {"head-dim", "N", "head dimension", [](CliArgs& a, std::string_view v) { a.head_dim = parse_int("head-dim", v, 1, kMaxInt); }},
      {"softmax-scale", "X", "scale of q.k before the softmax, any finite float (default: 1/sqrt(head-dim))",
       [](CliArgs& a, std::string_view v) { a.softmax_scale = parse_float("softmax-scale", v); }},
      {"causal", nullptr, "causal mask, aligned to the bottom-right corner", [](CliArgs& a, std::string_view) { a.causal = true; }},
      {"window", "LEFT,RIGHT", "sliding window; -1 = unbounded on that side",
       [](CliArgs& a, std::string_view v) {
         const size_t comma = v.find(',');
         if (comma == std::string_view::npos)
           throw UsageError("--window: expected LEFT,RIGHT (e.g. 128,0), got '" + std::string(v) + "'");
         a.window_left = parse_int("window", v.substr(0, comma), -1, std::numeric_limits<int64_t>::max());
         a.window_right = parse_int("window", v.substr(comma + 1), -1, std::numeric_limits<int64_t>::max());
       }},
      {"documents", "L1,L2,...", "documents of these lengths packed in each sequence (a column mask)",
       [](CliArgs& a, std::string_view v) {
         a.documents.clear();
         for (size_t at = 0; at <= v.size();) {
           const size_t comma = std::min(v.find(',', at), v.size());
           a.documents.push_back(parse_int("documents", v.substr(at, comma - at), 1, kMaxInt));
           at = comma + 1;
         }
       }},
      {"page-size", "N", "K/V read as pages of N rows via a block table (forward; CUDA: N % 128 == 0)",
       [](CliArgs& a, std::string_view v) { a.page_size = parse_int("page-size", v, 1, kMaxInt); }},
      {"dtype", "fp16|bf16|fp32", "element type (default: fp32 on cpu, fp16 on cuda)",
       [](CliArgs& a, std::string_view v) {
         a.dtype = parse_choice<DType>("dtype", v, {{"fp16", DType::kFloat16}, {"bf16", DType::kBFloat16}, {"fp32", DType::kFloat32}});
       }},
      {"layout", "bshd|bhsd", "memory order of q/k/v/out (default: bshd)",
       [](CliArgs& a, std::string_view v) {
         a.layout = parse_choice<Layout>("layout", v, {{"bshd", Layout::kBSHD}, {"bhsd", Layout::kBHSD}});
       }},
      {"backend", "auto|cpu|cuda", "auto: cuda when a GPU is usable, else cpu (default: auto)",
       [](CliArgs& a, std::string_view v) {
         a.backend = parse_choice<Backend>("backend", v, {{"auto", Backend::kAuto}, {"cpu", Backend::kCPU}, {"cuda", Backend::kCUDA}});
       }},
      {"iters", "N", "timed iterations; the median is reported", [](CliArgs& a, std::string_view v) { a.iters = parse_int("iters", v, 1, kMaxInt); }},
      {"warmup", "N", "untimed iterations before timing", [](CliArgs& a, std::string_view v) { a.warmup = parse_int("warmup", v, 0, kMaxInt); }},
      {"backward", nullptr, "time and check the backward pass (dq, dk, dv)", [](CliArgs& a, std::string_view) { a.backward = true; }},
      {"deterministic", nullptr, "with --backward: the deterministic backward, its checked call repeated and compared bit for bit",
       [](CliArgs& a, std::string_view) { a.deterministic = true; }},
      {"threads", "N", "host threads for the cpu backend and the check (default 0: all cores)",
       [](CliArgs& a, std::string_view v) { a.threads = parse_int("threads", v, 0, kMaxInt); }},
      {"seed", "N", "random seed of the inputs",
       [](CliArgs& a, std::string_view v) { a.seed = static_cast<uint64_t>(parse_int("seed", v, 0, std::numeric_limits<int64_t>::max())); }},
      {"check-rows", "N", "rows checked against float64 (0: no check)",
       [](CliArgs& a, std::string_view v) { a.check_rows = parse_int("check-rows", v, 0, kMaxInt); }},
      {"peers-naive", nullptr, "also time the naive float64 reference on the same shape (forward only)",
       [](CliArgs& a, std::string_view) { a.peers_naive = true; }},
      {"help", nullptr, "print this help", [](CliArgs& a, std::string_view) { a.help = true; }},
  };
  return table;
}

const Flag* find_flag(std::string_view name) {
  for (const Flag& f : flags())
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

const char* layout_name(Layout layout) { return layout == Layout::kBSHD ? "bshd" : "bhsd"; }

CliArgs parse_args(int argc, const char* const* argv) {
  CliArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.size() < 3 || arg.substr(0, 2) != "--") throw UsageError("unexpected argument '" + std::string(arg) + "'");
    const std::string_view body = arg.substr(2);
    const size_t eq = body.find('=');
    const std::string_view name = body.substr(0, eq);
    const Flag* flag = find_flag(name);
    if (flag == nullptr) throw UsageError("unknown flag '--" + std::string(name) + "'");
    std::string_view value;
    if (flag->metavar == nullptr) {
      if (eq != std::string_view::npos) throw UsageError("--" + std::string(name) + " takes no value");
    } else if (eq != std::string_view::npos) {
      value = body.substr(eq + 1);
    } else {
      if (i + 1 >= argc) throw UsageError("--" + std::string(name) + " needs a value (" + flag->metavar + ")");
      value = argv[++i];
    }
    flag->set(args, value);
  }
  return args;
}

RunConfig resolve(const CliArgs& a, bool cuda_available) {
  RunConfig c;
  if (a.backend == Backend::kAuto)
    c.backend = cuda_available ? Backend::kCUDA : Backend::kCPU;
  else
    c.backend = a.backend;
  const Defaults& d = c.backend == Backend::kCUDA ? kCudaDefaults : kCpuDefaults;
  c.batch = static_cast<int>(a.batch.value_or(d.batch));
  c.heads_q = static_cast<int>(a.heads.value_or(d.heads));
  c.heads_kv = static_cast<int>(a.kv_heads.value_or(c.heads_q));
  c.seqlen_q = a.seqlen_q.value_or(d.seqlen);
  c.seqlen_k = a.seqlen_k.value_or(c.seqlen_q);
  c.head_dim = static_cast<int>(a.head_dim.value_or(d.head_dim));
  c.scale = a.softmax_scale;
  c.causal = a.causal;
  c.window_left = a.window_left;
  c.window_right = a.window_right;
  c.dtype = a.dtype.value_or(d.dtype);
  c.layout = a.layout;
  c.iters = static_cast<int>(a.iters.value_or(d.iters));
  c.warmup = static_cast<int>(a.warmup.value_or(d.warmup));
  c.backward = a.backward;
  c.deterministic = a.deterministic;
  if (c.deterministic && !c.backward)
    throw UsageError("--deterministic applies to the backward pass; add --backward");
  c.threads = static_cast<int>(a.threads);
  c.seed = a.seed;
  c.check_rows = a.check_rows;
  c.peers_naive = a.peers_naive;
  if (c.peers_naive && c.backward)
    throw UsageError("--peers-naive times the forward pass only; drop --backward or --peers-naive");
  c.page_size = a.page_size;
  c.documents = a.documents;
  if (!c.documents.empty()) {
    int64_t total = 0;
    for (int64_t n : c.documents) total += n;
    if (!a.seqlen_q && !a.seqlen_k) c.seqlen_q = c.seqlen_k = total;
    if (total != c.seqlen_q || c.seqlen_k != c.seqlen_q)
      throw UsageError("--documents: the lengths add up to " + std::to_string(total) +
                       "; they must fill each sequence, with --seqlen-q and --seqlen-k equal to that sum");
    if (c.paged()) throw UsageError("--documents: column masks are for dense calls; drop --page-size or --documents");
  }
  if (c.paged() && c.backward)
    throw UsageError("--page-size: paged K/V is read by the forward only; drop --backward or --page-size");
  if (c.paged() && c.layout != Layout::kBSHD)
    throw UsageError("--page-size: paged K/V needs the bshd layout (pages of rows); drop --layout bhsd");
  // A paged run's offsets and page numbers are int32 (cu_seqlens, the block table).
  constexpr double kMaxOffset = std::numeric_limits<int32_t>::max();
  if (c.paged() && static_cast<double>(c.batch) * static_cast<double>(std::max(c.seqlen_q, c.stored_seqlen_k())) >
                       kMaxOffset)
    throw UsageError("--page-size: a paged run's offsets are int32: --batch x --seqlen-q/k must stay below 2^31");
  // Element counts and offsets are int64 products: a tensor past kMaxElements (far beyond any
  // memory) is a command-line error here rather than an overflowed size further on.
  const double largest = std::max(c.q_elements(), c.kv_elements());
  if (largest > kMaxElements) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", largest);
    throw UsageError(std::string("--batch, --heads, --seqlen-q/k and --head-dim give a tensor of ") + count +
                     " elements; at most 2^60");
  }
  return c;
}

double RunConfig::softmax_scale() const { return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }

double RunConfig::q_elements() const {
  return static_cast<double>(batch) * static_cast<double>(seqlen_q) * heads_q * head_dim;
}

double RunConfig::kv_elements() const {
  return static_cast<double>(batch) * static_cast<double>(stored_seqlen_k()) * heads_kv * head_dim;
}

int64_t RunConfig::stored_seqlen_k() const {
  return paged() ? (seqlen_k + page_size - 1) / page_size * page_size : seqlen_k;
}

std::string RunConfig::shape_str() const {
  return "B" + std::to_string(batch) + " H" + std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " Sq" +
         std::to_string(seqlen_q) + " Sk" + std::to_string(seqlen_k) + " D" + std::to_string(head_dim);
}

std::string RunConfig::mask_str() const {
  const bool window = window_left >= 0 || window_right >= 0;
  const std::string w = "window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
  const std::string docs = documents.empty() ? "" : "docs(" + std::to_string(documents.size()) + ")";
  const std::string base = causal ? (window ? "causal+" + w : "causal") : (window ? w : "");
  if (base.empty()) return docs.empty() ? "none" : docs;
  return docs.empty() ? base : base + "+" + docs;
}

RunConfig::Span RunConfig::document_of(int64_t i) const {
  int64_t start = 0;
  for (int64_t n : documents) {
    if (i < start + n) return {start, start + n};
    start += n;
  }
  return {0, seqlen_k};
}

std::string RunConfig::kv_str() const { return paged() ? "paged(" + std::to_string(page_size) + ")" : "dense"; }

std::string usage() {
  std::string text =
      "usage: fusedattn [--flag=value | --flag value]...\n"
      "Runs one fused-attention workload: random N(0,1) inputs, outputs poisoned with NaN, one checked\n"
      "call (sampled rows against float64), then warmup + timed iterations. Prints one result row.\n"
      "Exit status: 0 ok, 1 library or system error, 2 bad command line, 3 check failed.\n\nflags:\n";
  for (const Flag& f : flags()) {
    std::string left = std::string("  --") + f.name + (f.metavar ? std::string(" ") + f.metavar : "");
    constexpr size_t kHelpColumn = 30;
    left.resize(std::max(left.size() + 1, kHelpColumn), ' ');
    text += left + f.help + "\n";
  }
  text +=
      "\ndefaults: cpu B1 H8 S1024 D64 fp32, 5 iters + 1 warmup; cuda B4 H16 S4096 D128 fp16, 20 iters + 5 warmup;\n"
      "no mask; seed " + std::to_string(kDefaultSeed) + "; " + std::to_string(kDefaultCheckRows) + " check rows.\n";
  return text;
}

}  // namespace fusedattn::cli
