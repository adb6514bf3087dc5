#include "workload.h"

#include <initializer_list>
#include <random>
#include <vector>

#include "mask.h"
#include "numeric.h"
#include "parallel.h"

namespace fusedattn::cli {
namespace {

// All-ones bytes are NaN in fp16, bf16 and fp32 alike (exponent all ones, mantissa non-zero), so
// one byte fill poisons any dtype, on the host and through cudaMemset.
constexpr unsigned char kNaNByte = 0xFF;

// Inputs are generated in chunks with independent engines, so any thread count gives the same data.
constexpr int64_t kRandomChunk = int64_t{1} << 16;

// Distinct streams of the user's seed for each operand (SplitMix64 finaliser as the mixer).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
enum Stream : uint64_t { kStreamQ = 1, kStreamK, kStreamV, kStreamDout };

std::size_t byte_size(int64_t elements, DType dtype) { return static_cast<std::size_t>(elements) * dtype_size(dtype); }

}  // namespace

Operand::Operand(DType dtype, Layout layout, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                 bool on_device)
    : dtype_(dtype),
      shape_{batch, seqlen, heads, head_dim},
      buffer_(byte_size(batch * seqlen * heads * head_dim, dtype), on_device) {
  stride_[3] = 1;
  if (layout == Layout::kBSHD) {
    stride_[2] = head_dim;
    stride_[1] = heads * head_dim;
    stride_[0] = seqlen * heads * head_dim;
  } else {
    stride_[1] = head_dim;
    stride_[2] = seqlen * head_dim;
    stride_[0] = heads * seqlen * head_dim;
  }
  if (on_device) mirror_.resize(buffer_.bytes());
}

TensorView Operand::rows_view(int64_t rows, bool packed) const {
  TensorView t = view();
  if (packed) {
    t.rank = 3;
    t.shape[0] = shape_[0] * shape_[1];
    t.stride[0] = stride_[1];
    t.shape[1] = shape_[2];
    t.stride[1] = stride_[2];
    t.shape[2] = shape_[3];
    t.stride[2] = 1;
  } else {
    t.shape[0] = shape_[0] * shape_[1] / rows;  // bshd: every sequence's rows back to back
    t.stride[0] = rows * stride_[1];
    t.shape[1] = rows;
  }
  return t;
}

const void* Operand::host() const { return buffer_.on_device() ? mirror_.data() : buffer_.data(); }

TensorView Operand::view() const {
  TensorView t;
  t.data = buffer_.data();
  t.dtype = dtype_;
  t.rank = 4;
  for (int d = 0; d < 4; ++d) {
    t.shape[d] = shape_[d];
    t.stride[d] = stride_[d];
  }
  t.device = buffer_.on_device() ? Device{DeviceType::kCUDA, 0} : Device{DeviceType::kCPU, 0};
  return t;
}

void Operand::randomize(uint64_t seed, int threads) {
  // Storage order does not matter for i.i.d. values, so fill the bytes linearly.
  void* dst = buffer_.on_device() ? static_cast<void*>(mirror_.data()) : buffer_.data();
  const int64_t n = static_cast<int64_t>(buffer_.bytes() / dtype_size(dtype_));
  const int64_t chunks = (n + kRandomChunk - 1) / kRandomChunk;
  parallel_for(chunks, threads, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      std::mt19937_64 engine(mix(seed ^ mix(static_cast<uint64_t>(c))));
      std::normal_distribution<double> normal(0.0, 1.0);
      const int64_t stop = std::min(n, (c + 1) * kRandomChunk);
      for (int64_t i = c * kRandomChunk; i < stop; ++i) numeric::store(dtype_, dst, i, normal(engine));
    }
  });
  if (buffer_.on_device()) buffer_.upload(mirror_.data());
}

void Operand::poison() { buffer_.fill_bytes(kNaNByte); }

void Operand::fetch() {
  if (buffer_.on_device()) buffer_.download(mirror_.data());
}

std::vector<unsigned char> Operand::host_bytes() const {
  const auto* bytes = static_cast<const unsigned char*>(host());
  return {bytes, bytes + buffer_.bytes()};
}

void Operand::read_row(int64_t b, int64_t s, int64_t h, double* dst) const {
  const int64_t base = b * stride_[0] + s * stride_[1] + h * stride_[2];
  for (int64_t d = 0; d < shape_[3]; ++d) dst[d] = numeric::load(dtype_, host(), base + d);
}

LseTensor::LseTensor(int64_t batch, int64_t heads, int64_t seqlen, bool on_device, bool packed)
    : batch_(batch),
      heads_(heads),
      seqlen_(seqlen),
      packed_(packed),
      buffer_(byte_size(batch * heads * seqlen, DType::kFloat32), on_device),
      host_(static_cast<size_t>(batch * heads * seqlen)) {}

TensorView LseTensor::view() const {
  const Device device = buffer_.on_device() ? Device{DeviceType::kCUDA, 0} : Device{DeviceType::kCPU, 0};
  if (packed_) return TensorView::contiguous(buffer_.data(), DType::kFloat32, {heads_, batch_ * seqlen_}, device);
  return TensorView::contiguous(buffer_.data(), DType::kFloat32, {batch_, heads_, seqlen_}, device);
}

void LseTensor::poison() { buffer_.fill_bytes(kNaNByte); }

void LseTensor::fetch() { buffer_.download(host_.data()); }

Workload::Workload(const RunConfig& c)
    : config(c),
      q(c.dtype, c.layout, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.on_device()),
      k(c.dtype, c.layout, c.batch, c.stored_seqlen_k(), c.heads_kv, c.head_dim, c.on_device()),
      v(c.dtype, c.layout, c.batch, c.stored_seqlen_k(), c.heads_kv, c.head_dim, c.on_device()),
      out(c.dtype, c.layout, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.on_device()),
      lse(c.batch, c.heads_q, c.seqlen_q, c.on_device(), c.paged()) {
  if (c.paged()) {
    const int64_t pages_per_seq = c.stored_seqlen_k() / c.page_size;
    std::vector<int32_t> offsets_q, offsets_k, table;
    for (int64_t b = 0; b <= c.batch; ++b) {
      offsets_q.push_back(static_cast<int32_t>(b * c.seqlen_q));
      offsets_k.push_back(static_cast<int32_t>(b * c.seqlen_k));
    }
    for (int64_t page = 0; page < c.batch * pages_per_seq; ++page) table.push_back(static_cast<int32_t>(page));
    const auto upload = [&](BackendBuffer& buffer, const std::vector<int32_t>& values) {
      buffer = BackendBuffer(values.size() * sizeof(int32_t), c.on_device());
      buffer.upload(values.data());
    };
    upload(cu_q, offsets_q);
    upload(cu_k, offsets_k);
    upload(block_table, table);
  }
  if (!c.documents.empty()) {
    std::vector<int32_t> bounds;  // two intervals of hidden rows per key: before and after its document
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.seqlen_k; ++j) {
        const RunConfig::Span doc = c.document_of(j);
        for (const int64_t bound : {int64_t{0}, doc.start, doc.end, c.seqlen_q}) bounds.push_back(static_cast<int32_t>(bound));
      }
    column_mask = BackendBuffer(bounds.size() * sizeof(int32_t), c.on_device());
    column_mask.upload(bounds.data());
  }
  if (!c.backward) return;
  dout = Operand(c.dtype, c.layout, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.on_device());
  dq = Operand(c.dtype, c.layout, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.on_device());
  dk = Operand(c.dtype, c.layout, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.on_device());
  dv = Operand(c.dtype, c.layout, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.on_device());
}

Options Workload::options() const {
  Options o;
  if (config.scale) o.softmax_scale = static_cast<float>(*config.scale);
  o.causal = config.causal;
  o.window_left = config.window_left;
  o.window_right = config.window_right;
  o.backend = config.backend;
  o.num_threads = config.threads;
  if (!config.documents.empty()) {
    const Device device = config.on_device() ? Device{DeviceType::kCUDA, 0} : Device{DeviceType::kCPU, 0};
    o.column_mask = TensorView::contiguous(column_mask.data(), DType::kInt32, {config.batch, 1, config.seqlen_k, kDocumentBoundsPerKey}, device);
  }
  return o;
}

ForwardArgs Workload::forward_args(bool timed) const {
  ForwardArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.options = options();
  if (!config.paged()) return a;
  const Device device = config.on_device() ? Device{DeviceType::kCUDA, 0} : Device{DeviceType::kCPU, 0};
  const auto int32s = [&](const BackendBuffer& buffer, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(buffer.data(), DType::kInt32, shape, device);
  };
  a.q = q.rows_view(config.seqlen_q, /*packed=*/true);
  a.out = out.rows_view(config.seqlen_q, /*packed=*/true);
  a.k = k.rows_view(config.page_size, /*packed=*/false);
  a.v = v.rows_view(config.page_size, /*packed=*/false);
  Options& o = a.options;
  o.cu_seqlens_q = int32s(cu_q, {config.batch + 1});
  o.cu_seqlens_k = int32s(cu_k, {config.batch + 1});
  o.max_seqlen_q = config.seqlen_q;
  o.max_seqlen_k = config.seqlen_k;
  o.block_table = int32s(block_table, {config.batch, config.stored_seqlen_k() / config.page_size});
  if (timed) {
    o.checked_rows_q = config.batch * config.seqlen_q;
    o.checked_rows_k = config.batch * config.seqlen_k;
  }
  return a;
}

BackwardArgs Workload::backward_args() const {
  BackwardArgs a;
  a.dout = dout.view();
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.out = out.view();
  a.lse = lse.view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  a.options = options();
  a.deterministic = config.deterministic;
  a.workspace = workspace.data();
  a.workspace_bytes = workspace.bytes();
  return a;
}

void Workload::randomize() {
  const int threads = resolve_threads(config.threads);
  q.randomize(mix(config.seed + kStreamQ), threads);
  k.randomize(mix(config.seed + kStreamK), threads);
  v.randomize(mix(config.seed + kStreamV), threads);
  if (config.backward) dout.randomize(mix(config.seed + kStreamDout), threads);
}

void Workload::poison_forward_outputs() {
  out.poison();
  lse.poison();
}

void Workload::poison_backward_outputs() {
  dq.poison();
  dk.poison();
  dv.poison();
}

void Workload::fetch_forward_outputs() {
  out.fetch();
  lse.fetch();
}

void Workload::fetch_backward_outputs() {
  dq.fetch();
  dk.fetch();
  dv.fetch();
}

void Workload::allocate_workspace() {
  const std::size_t bytes = backward_workspace_bytes(backward_args());
  workspace = BackendBuffer(bytes, config.on_device());
}

double attention_flops(const RunConfig& c) {
  constexpr double kFlopsPerPairPerDim = 4.0;  // QK^T and PV: one multiply-add (2 flops) each
  constexpr double kBackwardFactor = 2.5;      // five matmuls instead of two
  const double heads = static_cast<double>(c.batch) * c.heads_q;
  double pairs = static_cast<double>(c.seqlen_q) * static_cast<double>(c.seqlen_k);
  if (c.window_left >= 0 || (!c.causal && c.window_right >= 0) || !c.documents.empty()) {
    pairs = 0;
    for (int64_t i = 0; i < c.seqlen_q; ++i) pairs += static_cast<double>(visible_keys(c, i).size());
  } else if (c.causal) {
    pairs /= 2;
  }
  const double forward = kFlopsPerPairPerDim * heads * pairs * c.head_dim;
  return c.backward ? kBackwardFactor * forward : forward;
}

}  // namespace fusedattn::cli
