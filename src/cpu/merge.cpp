// merge_attention on the CPU backend (merge.h): runs of rows handed to the threads; each row's
// weights come from its two LSEs (merge_weights, params.h), then its elements are merged in fp32.
#include <algorithm>
#include <cstdint>

#include "cpu/convert.h"
#include "cpu/cpu_backend.h"
#include "cpu/threads.h"

namespace fusedattn::cpu {
namespace {
namespace isa = FUSEDATTN_CPU_ISA;

// Rows per task: enough that handing a task out costs little beside its rows' elements.
constexpr int64_t kRowsPerTask = 64;

// A storage dtype's loads and stores as float.
struct F32 {
  using Storage = float;
  static float load(Storage x) { return x; }
  static Storage store(float x) { return x; }
};
struct F16 {
  using Storage = uint16_t;
  static float load(Storage x) { return isa::half_to_float(x); }
  static Storage store(float x) { return isa::float_to_half(x); }
};
struct BF16 {
  using Storage = uint16_t;
  static float load(Storage x) { return isa::bf16_to_float(x); }
  static Storage store(float x) { return isa::float_to_bf16(x); }
};

template <class Out, class Part>
void merge_rows(const MergeParams& p, int64_t first, int64_t end) {
  auto* out = static_cast<typename Out::Storage*>(p.out);
  const auto* part = static_cast<const typename Part::Storage*>(p.part_out);
  for (int64_t r = first; r < end; ++r) {
    const int64_t h = r % p.heads, s = r / p.heads % p.seqlen, b = r / p.heads / p.seqlen;
    const auto at = [&](const OperandStrides& st) { return b * st.batch + s * st.row + h * st.head; };
    float& lse = p.lse[at(p.lse_stride)];
    const MergeWeights w = merge_weights(lse, p.part_lse[at(p.part_lse_stride)]);
    typename Out::Storage* o = out + at(p.out_stride);
    const typename Part::Storage* q = part + at(p.part_stride);
    for (int64_t d = 0; d < p.head_dim; ++d) o[d] = Out::store(merge_element(w, Out::load(o[d]), Part::load(q[d])));
    lse = w.lse;
  }
}

template <class Out>
void merge_rows_from(const MergeParams& p, int64_t first, int64_t end) {
  switch (p.part_dtype) {
    case DType::kFloat16: return merge_rows<Out, F16>(p, first, end);
    case DType::kBFloat16: return merge_rows<Out, BF16>(p, first, end);
    default: return merge_rows<Out, F32>(p, first, end);
  }
}

}  // namespace

void merge_attention(const MergeParams& p) {
  const int64_t rows = p.batch * p.seqlen * p.heads;
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  isa::parallel_for(
      tasks, p.num_threads, [] { return 0; },
      [&](int, int64_t task) {
        const int64_t first = task * kRowsPerTask, end = std::min(rows, first + kRowsPerTask);
        switch (p.out_dtype) {
          case DType::kFloat16: return merge_rows_from<F16>(p, first, end);
          case DType::kBFloat16: return merge_rows_from<BF16>(p, first, end);
          default: return merge_rows_from<F32>(p, first, end);
        }
      });
}

}  // namespace fusedattn::cpu
