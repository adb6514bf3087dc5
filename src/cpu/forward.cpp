// CPU forward: FlashAttention-2 with query blocks outer and key tiles inner. One task is one
// (batch, query head, query block); it owns its output rows and LSE entries, so tasks run on
// any thread in any order and the result is always the same.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/config.h"
#include "cpu/cpu_backend.h"
#include "cpu/mask.h"
#include "cpu/simd.h"
#include "cpu/softmax.h"
#include "cpu/threads.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace fusedattn::cpu {
namespace {

// Per-thread working set: O(block * (block + head_dim)) floats whatever the sequence length.
struct ForwardScratch {
  explicit ForwardScratch(int dim)
      : q(static_cast<size_t>(kBlockQ) * dim),
        kt(static_cast<size_t>(dim) * kBlockK),
        v(static_cast<size_t>(kBlockK) * dim),
        o(static_cast<size_t>(kBlockQ) * dim),
        row(static_cast<size_t>(dim)),
        s(static_cast<size_t>(kBlockQ) * kBlockK),
        softmax(kBlockQ),
        ranges(kBlockQ) {}
  std::vector<float> q;   // [kBlockQ][dim], pre-multiplied by scale * log2(e)
  std::vector<float> kt;  // [dim][kBlockK], K transposed so S rows are contiguous
  std::vector<float> v;   // [kBlockK][dim]
  std::vector<float> o;   // [kBlockQ][dim], unnormalised output accumulator
  std::vector<float> row; // one converted row for the transposed load
  std::vector<float> s;   // [kBlockQ][kBlockK], scores, then probabilities
  std::vector<RowSoftmax> softmax;
  std::vector<ColRange> ranges;
};

struct QueryBlock {
  int b, h;
  int64_t block;
};

// Heavy blocks first: under a causal mask the last query blocks see the most keys, and handing
// them out early leaves the cheap ones to even out the threads at the end.
QueryBlock decode_task(const FwdParams& p, int64_t task, int64_t blocks_per_head) {
  const int64_t per_batch = blocks_per_head * p.heads_q;
  const int b = static_cast<int>(task / per_batch);
  const int h = static_cast<int>(task % per_batch / blocks_per_head);
  return {b, h, blocks_per_head - 1 - task % blocks_per_head};
}

FUSEDATTN_CPU_HOT void attend_query_block(const FwdParams& p, const QueryBlock& t, ForwardScratch& w) {
  const SeqInfo seq = seq_info(p, t.b);
  const int64_t r0 = t.block * kBlockQ;
  if (r0 >= seq.len_q) return;  // varlen: this sequence is shorter than max_seqlen_q
  const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - r0));
  const int dim = p.head_dim;
  const int kv_head = t.h / (p.heads_q / p.heads_kv);
  const Operand q{p.q, p.q_stride, p.dtype}, k{p.k, p.k_stride, p.dtype}, v{p.v, p.v_stride, p.dtype};

  load_tile(q, t.b, seq.q_start, r0, rows, t.h, dim, p.scale_log2, w.q.data());
  std::fill(w.o.begin(), w.o.begin() + int64_t{rows} * dim, 0.f);
  std::fill(w.softmax.begin(), w.softmax.begin() + rows, RowSoftmax{});

  // Key tiles start at the block's first visible key; tiles wholly outside every row's window
  // are never visited, and only tiles cut by a mask edge pay for per-row column ranges.
  const KeyRange keys = block_key_range(p, r0, rows, seq.len_q, seq.len_k);
  for (int64_t c0 = keys.lo; c0 <= keys.hi; c0 += kBlockK) {
    const int cols = static_cast<int>(std::min<int64_t>(kBlockK, keys.hi - c0 + 1));
    tile_col_ranges(p, r0, rows, seq.len_q, seq.len_k, c0, cols, w.ranges.data());
    load_tile_transposed(k, t.b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.kt.data());
    load_tile(v, t.b, seq.k_start, c0, cols, kv_head, dim, 1.f, w.v.data());

    matmul_transposed_b(w.q.data(), rows, dim, w.kt.data(), kBlockK, cols, w.s.data(), kBlockK);
    for (int r = 0; r < rows; ++r) {
      const float rescale = w.softmax[r].update(w.s.data() + int64_t{r} * kBlockK, w.ranges[r]);
      if (rescale != 1.f) {
        float* o_row = w.o.data() + int64_t{r} * dim;
        for (int d = 0; d < dim; ++d) o_row[d] *= rescale;
      }
    }
    accumulate_pb(w.s.data(), kBlockK, w.ranges.data(), rows, w.v.data(), dim, w.o.data());
  }

  for (int r = 0; r < rows; ++r) {
    float* o_row = w.o.data() + int64_t{r} * dim;
    const float inv = w.softmax[r].inverse_sum();
    for (int d = 0; d < dim; ++d) o_row[d] *= inv;
  }
  store_tile(p.o, p.o_stride, p.dtype, t.b, seq.q_start, r0, rows, t.h, dim, 1.f, w.o.data());
  if (p.lse != nullptr) {
    // Dense: lse[b][h][i]; varlen: lse[h][q_start + i] (batch stride 0).
    float* lse = p.lse + t.b * p.lse_batch_stride + t.h * p.lse_head_stride + seq.q_start + r0;
    for (int r = 0; r < rows; ++r) lse[r] = w.softmax[r].lse();
  }
}

}  // namespace

void forward(const FwdParams& params) {
  // A grouped decode reads each KV head once per group (params.h): the K/V tile loads, which a
  // task of one query row spends most of its time in, are shared by the group's rows.
  const FwdParams p = decode_groups_as_rows(params);
  const int64_t blocks_per_head = (p.seqlen_q + kBlockQ - 1) / kBlockQ;
  const int64_t num_tasks = int64_t{p.batch} * p.heads_q * blocks_per_head;
  parallel_for(
      num_tasks, p.num_threads, [&] { return ForwardScratch(p.head_dim); },
      [&](ForwardScratch& w, int64_t task) { attend_query_block(p, decode_task(p, task, blocks_per_head), w); });
}

}  // namespace fusedattn::cpu
