// merge_attention on the CPU backend (merge.h): runs of rows handed to the threads; each row's
// weights come from its two LSEs (merge_weights, params.h), then its elements are converted to
// float a chunk at a time (tile_io.h's row loads and stores), merged, and written back.
#include <algorithm>
#include <cstdint>

#include "cpu/cpu_backend.h"
#include "cpu/threads.h"
#include "cpu/tile_io.h"

namespace fusedattn::cpu {
namespace {
namespace isa = FUSEDATTN_CPU_ISA;

// Rows per task: enough that handing a task out costs little beside its rows' elements.
constexpr int64_t kRowsPerTask = 64;
// Elements of a row converted at a time (two buffers of them on the stack).
constexpr int kChunk = 256;

void merge_rows(const MergeParams& p, int64_t first, int64_t end) {
  float out[kChunk], part[kChunk];
  for (int64_t r = first; r < end; ++r) {
    const int64_t h = r % p.heads, s = r / p.heads % p.seqlen, b = r / p.heads / p.seqlen;
    float& lse = p.lse[element_offset(p.lse_stride, b, s, h)];
    const MergeWeights w = merge_weights(lse, p.part_lse[element_offset(p.part_lse_stride, b, s, h)]);
    const int64_t out_at = element_offset(p.out_stride, b, s, h), part_at = element_offset(p.part_stride, b, s, h);
    for (int64_t d0 = 0; d0 < p.head_dim; d0 += kChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kChunk, p.head_dim - d0));
      isa::load_row(p.out, p.out_dtype, out_at + d0, n, 1.f, out);
      isa::load_row(p.part_out, p.part_dtype, part_at + d0, n, 1.f, part);
      for (int d = 0; d < n; ++d) out[d] = merge_element(w, out[d], part[d]);
      isa::store_row(p.out, p.out_dtype, out_at + d0, n, 1.f, out);
    }
    lse = w.lse;
  }
}

}  // namespace

void merge_attention(const MergeParams& p) {
  const int64_t rows = p.batch * p.seqlen * p.heads;
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  isa::parallel_for(
      tasks, p.num_threads, [] { return 0; },
      [&](int, int64_t task) { merge_rows(p, task * kRowsPerTask, std::min(rows, (task + 1) * kRowsPerTask)); });
}

}  // namespace fusedattn::cpu
