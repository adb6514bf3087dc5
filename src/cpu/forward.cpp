// CPU forward: FlashAttention-2 with query blocks outer and key tiles inner. One task is one
// (batch, query head, query block); it owns its output rows and LSE entries, so tasks run on
// any thread in any order and the result is always the same. A launch of few tasks over many
// keys splits each task's keys into parts, combined in part order (key_parts.h). Decode steps
// whose K/V rows hold their heads side by side go to decode.cpp instead.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/column_mask.h"
#include "cpu/config.h"
#include "cpu/cpu_backend.h"
#include "cpu/decode.h"
#include "cpu/isa.h"
#include "cpu/key_parts.h"
#include "cpu/mask.h"
#include "cpu/simd.h"
#include "cpu/softmax.h"
#include "cpu/threads.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"
#include "cpu/transposed_rows.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {
namespace {

// Per-thread working set: O(block * (block + head_dim)) floats whatever the sequence length, for
// query blocks of up to kWideBlockQ rows.
struct ForwardScratch {
  explicit ForwardScratch(int dim)
      : q(static_cast<size_t>(kWideBlockQ) * dim),
        kt(static_cast<size_t>(dim) * kBlockK),
        v(static_cast<size_t>(kBlockK) * dim),
        o(static_cast<size_t>(kWideBlockQ) * dim),
        row(static_cast<size_t>(dim)),
        s(static_cast<size_t>(kWideBlockQ) * kBlockK),
        softmax(kWideBlockQ),
        ranges(kWideBlockQ),
        lse(kWideBlockQ) {}
  std::vector<float> q;   // [block rows][dim], pre-multiplied by scale * log2(e)
  std::vector<float> kt;  // [dim][kBlockK], K transposed so S rows are contiguous
  std::vector<float> v;   // [kBlockK][dim]
  std::vector<float> o;   // [block rows][dim], unnormalised output accumulator
  std::vector<float> row; // one converted row for the transposed load
  std::vector<float> s;   // [block rows][kBlockK], scores, then probabilities
  std::vector<RowSoftmax> softmax;
  std::vector<ColRange> ranges;
  std::vector<float> lse;  // [block rows], the rows' natural-log LSE once o is normalised
};

// Query rows per task: kWideBlockQ where the mask is full and that leaves every thread
// kMinTasksPerThread tasks, so each K/V tile load serves twice the rows; else kBlockQ. Every row's
// output is the same either way: its scores, softmax and sums do not depend on which rows share
// its task. On a 2-core Zen 3 (AVX2), fp32, CLI A/B alternating 30 rounds: full 1k d64 one thread
// 4.5% faster (28 of 30 rounds), two threads 2.7% by the minimum (28 of 30), batch 4 x 512 level
// to 3.5% (22 of 30). Masked launches keep kBlockQ: a wide block's key range is its last row's,
// so under a causal mask it computes more hidden scores (1k: +6% of the products) and read 2-3%
// slower at bf16 causal 1k d64 (14 of 20 rounds), 1-2% faster at fp32 causal 2k d128; under a
// column mask a tile hidden from every row of a narrow block is skipped but may be only partly
// hidden from a wide one's.
inline constexpr int64_t kMinTasksPerThread = 4;
int forward_block_rows(const FwdParams& p) {
  if (p.is_masked()) return kBlockQ;
  const int64_t wide_tasks = int64_t{p.batch} * p.heads_q * ((p.seqlen_q + kWideBlockQ - 1) / kWideBlockQ);
  const int threads = resolve_num_threads(p.num_threads, wide_tasks * kMinTasksPerThread);
  return wide_tasks >= kMinTasksPerThread * threads ? kWideBlockQ : kBlockQ;
}

// A task's (sequence, query head) and first query row.
struct QueryBlock {
  int b, h;
  int64_t r0;
};

// Heavy blocks first: under a causal mask the last query blocks see the most keys, and handing
// them out early leaves the cheap ones to even out the threads at the end.
QueryBlock decode_task(const FwdParams& p, int64_t task, int64_t blocks_per_head, int block_rows) {
  const int64_t per_batch = blocks_per_head * p.heads_q;
  const int b = static_cast<int>(task / per_batch);
  const int h = static_cast<int>(task % per_batch / blocks_per_head);
  return {b, h, (blocks_per_head - 1 - task % blocks_per_head) * block_rows};
}

// Parts per task (key_parts.h): 1 (no split) unless the mask is full and every head is one query
// block.
int key_parts(const FwdParams& p, int64_t num_tasks) {
  if (p.is_masked() || p.seqlen_q > kBlockQ) return 1;
  return split_parts(num_tasks, p.seqlen_k);
}

// K or V as the tiles read them: through the block table where K/V are paged.
Operand kv_operand(const FwdParams& p, const void* data, const OperandStrides& stride) {
  return {data, stride, p.dtype, p.block_table != nullptr ? &p : nullptr};
}

// The task's query rows (0 where its sequence has none: varlen, shorter than max_seqlen_q).
int query_rows(const FwdParams& p, const QueryBlock& t, int block_rows) {
  const int64_t len_q = seq_info(p, t.b).len_q;
  return t.r0 >= len_q ? 0 : static_cast<int>(std::min<int64_t>(block_rows, len_q - t.r0));
}

// Task t's `rows` query rows (query_rows) against part `part` of `parts` of their keys: w.o gets
// the rows' normalised output, w.lse their LSE.
FUSEDATTN_CPU_HOT void attend_query_block(const FwdParams& p, const QueryBlock& t, int rows, int part, int parts,
                                          const TransposedRows& keys_t, ForwardScratch& w) {
  const SeqInfo seq = seq_info(p, t.b);
  const int64_t r0 = t.r0;
  const int dim = p.head_dim;
  const int kv_head = t.h / (p.heads_q / p.heads_kv);
  const Operand q{p.q, p.q_stride, p.dtype};
  const Operand k = kv_operand(p, p.k, p.k_stride), v = kv_operand(p, p.v, p.v_stride);

  load_tile(q, t.b, seq.q_start, r0, rows, t.h, dim, p.scale_log2, w.q.data());
  std::fill(w.o.begin(), w.o.begin() + int64_t{rows} * dim, 0.f);
  std::fill(w.softmax.begin(), w.softmax.begin() + rows, RowSoftmax{});

  // Key tiles start at the block's first visible key; tiles wholly outside every row's window
  // are never visited, and only tiles cut by a mask edge pay for per-row column ranges. A column
  // mask skips the tiles it hides from every row and hides scores only where it cuts a tile.
  const ColumnMask column_mask(p, t.b, t.h);
  const KeyRange keys = part_of(block_key_range(p, r0, rows, seq.len_q, seq.len_k), part, parts);
  for (int64_t c0 = keys.lo; c0 <= keys.hi; c0 += kBlockK) {
    const int cols = static_cast<int>(std::min<int64_t>(kBlockK, keys.hi - c0 + 1));
    const TileCover cover = column_mask.cover(r0, rows, c0, cols);
    if (cover == TileCover::kAll) continue;
    tile_col_ranges(p, r0, rows, seq.len_q, seq.len_k, c0, cols, w.ranges.data());
    const TransposedTile kt = keys_t.tile(k, t.b, seq.k_start, c0, cols, kv_head, dim, w.row.data(), w.kt.data());
    load_tile(v, t.b, seq.k_start, c0, cols, kv_head, dim, 1.f, w.v.data());
    // The next tile's first rows, whose loads the tile loads' own prefetch (tile_io.h) cannot
    // reach, on their way while this tile is computed (K's only where its tiles are read from it,
    // not from the transposed copy).
    const int64_t next = c0 + kBlockK;
    if (next <= keys.hi) {
      const int ahead = static_cast<int>(std::min<int64_t>(kPrefetchRowsAhead, keys.hi - next + 1));
      for (int r = 0; r < ahead; ++r) {
        if (!keys_t.copied()) prefetch_row(k, k.offset(t.b, seq.k_start, next + r, kv_head), dim);
        prefetch_row(v, v.offset(t.b, seq.k_start, next + r, kv_head), dim);
      }
    }

    matmul_transposed_b(w.q.data(), rows, dim, kt.data, kt.ld, cols, w.s.data(), kBlockK);
    if (cover == TileCover::kPartial) column_mask.hide(r0, rows, c0, cols, w.s.data(), kBlockK);
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
    w.lse[r] = w.softmax[r].lse();
  }
}

// Task t's rows from w.o and w.lse to out and lse.
void store_query_block(const FwdParams& p, const QueryBlock& t, int rows, const ForwardScratch& w) {
  const SeqInfo seq = seq_info(p, t.b);
  const int64_t r0 = t.r0;
  store_tile(p.o, p.o_stride, p.dtype, t.b, seq.q_start, r0, rows, t.h, p.head_dim, 1.f, w.o.data());
  if (p.lse != nullptr) {
    // Dense: lse[b][h][i]; varlen: lse[h][q_start + i] (batch stride 0).
    float* lse = p.lse + t.b * p.lse_batch_stride + t.h * p.lse_head_stride + seq.q_start + r0;
    std::copy(w.lse.begin(), w.lse.begin() + rows, lse);
  }
}

}  // namespace

void forward(const FwdParams& params) {
  if (decodes_by_key_rows(params)) return decode_by_key_rows(params);
  // A grouped decode reads each KV head once per group (params.h): the K/V tile loads, which a
  // task of one query row spends most of its time in, are shared by the group's rows.
  const FwdParams p = decode_groups_as_rows(params);
  const int block_rows = forward_block_rows(p);
  const int64_t blocks_per_head = (p.seqlen_q + block_rows - 1) / block_rows;
  const int64_t num_tasks = int64_t{p.batch} * p.heads_q * blocks_per_head;
  const auto scratch = [&] { return ForwardScratch(p.head_dim); };
  const int parts = key_parts(p, num_tasks);
  if (parts == 1) {
    const TransposedRows keys_t(p, kv_operand(p, p.k, p.k_stride), blocks_per_head * (p.heads_q / p.heads_kv));
    parallel_for(num_tasks, p.num_threads, scratch, [&](ForwardScratch& w, int64_t task) {
      const QueryBlock t = decode_task(p, task, blocks_per_head, block_rows);
      if (const int rows = query_rows(p, t, block_rows)) {
        attend_query_block(p, t, rows, 0, 1, keys_t, w);
        store_query_block(p, t, rows, w);
      }
    });
    return;
  }
  PartRows part_rows(num_tasks, parts, p.seqlen_q, p.head_dim);  // every head is one query block
  const TransposedRows no_keys_t;  // each key tile is read by one task: transposed by it
  parallel_for(num_tasks * parts, p.num_threads, scratch, [&](ForwardScratch& w, int64_t item) {
    const int64_t task = item / parts;
    const int part = static_cast<int>(item % parts);
    const QueryBlock t = decode_task(p, task, blocks_per_head, block_rows);
    if (const int rows = query_rows(p, t, block_rows)) {
      attend_query_block(p, t, rows, part, parts, no_keys_t, w);
      part_rows.save(task, part, rows, w.o.data(), w.lse.data());
    }
  });
  parallel_for(num_tasks, p.num_threads, scratch, [&](ForwardScratch& w, int64_t task) {
    const QueryBlock t = decode_task(p, task, blocks_per_head, block_rows);
    if (const int rows = query_rows(p, t, block_rows)) {
      part_rows.combine(task, rows, w.o.data(), w.lse.data());
      store_query_block(p, t, rows, w);
    }
  });
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
