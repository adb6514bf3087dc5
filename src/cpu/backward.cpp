// CPU backward: P is recomputed tile by tile from the saved LSE, never stored. Every task owns the
// gradient rows it writes, so no two threads ever touch the same output and the result is
// bit-identical run to run (`deterministic` is therefore always honoured). Two plans
// (backward_plan.h chooses):
//   - fused, one task per (batch, KV head): for each key block, dK and dV summed over every query
//     head of the GQA group and every query block that sees the keys, and each tile's dS K added
//     into the group's dQ rows, held in fp32 for the whole task (5 tile products per tile);
//   - two passes, where there are too few (batch, KV head) pairs for the threads or their dQ rows
//     would take too much memory: a key pass, one task per (batch, KV head, key block), for dK and
//     dV, then a query pass, one task per (batch, query head, query block), for dQ, which
//     recomputes S and dP (7 tile products instead of 5) to parallelise without accumulators.
// Both visit the tiles in the same order and fold each sum in the same order, so they give the
// same bits: the thread count never changes a result.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/backward_plan.h"
#include "cpu/column_mask.h"
#include "cpu/config.h"
#include "cpu/cpu_backend.h"
#include "cpu/exp2.h"
#include "cpu/isa.h"
#include "cpu/mask.h"
#include "cpu/simd.h"
#include "cpu/softmax.h"
#include "cpu/threads.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {
namespace {

inline constexpr float kLog2e = 1.44269504088896340736f;
inline constexpr int kMaxBlock = kBlockQ > kBlockK ? kBlockQ : kBlockK;

struct BackwardScratch {
  explicit BackwardScratch(int dim)
      : q(static_cast<size_t>(kBlockQ) * dim),
        dout(static_cast<size_t>(kBlockQ) * dim),
        o(static_cast<size_t>(kBlockQ) * dim),
        kt(static_cast<size_t>(dim) * kBlockK),
        vt(static_cast<size_t>(dim) * kBlockK),
        k(static_cast<size_t>(kBlockK) * dim),
        row(static_cast<size_t>(dim)),
        s(static_cast<size_t>(kBlockQ) * kBlockK),
        dp(static_cast<size_t>(kBlockQ) * kBlockK),
        acc_a(static_cast<size_t>(kMaxBlock) * dim),
        acc_b(static_cast<size_t>(kBlockK) * dim),
        delta(kBlockQ),
        lse_log2(kBlockQ),
        ranges(kBlockQ) {}
  std::vector<float> q, dout, o;  // [kBlockQ][dim] query-side tiles
  std::vector<float> kt, vt;      // [dim][kBlockK] key-side tiles, transposed
  std::vector<float> k;           // [kBlockK][dim], for dQ += dS K
  std::vector<float> row;         // one converted row for the transposed loads
  std::vector<float> s;           // [kBlockQ][kBlockK] scores, then P
  std::vector<float> dp;          // [kBlockQ][kBlockK] dP, then dS
  std::vector<float> acc_a;       // dK (key pass) or dQ (query pass) accumulator
  std::vector<float> acc_b;       // dV accumulator (key pass)
  std::vector<float> delta;       // rowsum(dO o O) per query row
  std::vector<float> lse_log2;    // saved LSE in log2 units per query row
  std::vector<ColRange> ranges;
};

struct Operands {
  Operand q, k, v, o, dout;
  explicit Operands(const BwdParams& p)
      : q{p.q, p.q_stride, p.dtype},
        k{p.k, p.k_stride, p.dtype},
        v{p.v, p.v_stride, p.dtype},
        o{p.o, p.o_stride, p.dtype},
        dout{p.dout, p.do_stride, p.dtype} {}
};

// Per-row statistics of query rows: delta = rowsum(dO o O) and the saved LSE in log2 units.
struct RowStats {
  const float* delta;
  const float* lse_log2;
};

// Loads Q and dO of query rows [r0, r0 + rows) of head h.
FUSEDATTN_CPU_HOT void load_query_tiles(const BwdParams& p, const Operands& ops, int b, int h, const SeqInfo& seq,
                                        int64_t r0, int rows, BackwardScratch& w) {
  load_tile(ops.q, b, seq.q_start, r0, rows, h, p.head_dim, 1.f, w.q.data());
  load_tile(ops.dout, b, seq.q_start, r0, rows, h, p.head_dim, 1.f, w.dout.data());
}

// delta and the LSE (in log2 units) of query rows [r0, r0 + rows) of head h, written to
// delta[0, rows) and lse_log2[0, rows); w.dout and w.o are left holding the rows' dO and O.
FUSEDATTN_CPU_HOT void compute_row_stats(const BwdParams& p, const Operands& ops, int b, int h, const SeqInfo& seq,
                                         int64_t r0, int rows, BackwardScratch& w, float* delta, float* lse_log2) {
  const int dim = p.head_dim;
  load_tile(ops.dout, b, seq.q_start, r0, rows, h, dim, 1.f, w.dout.data());
  load_tile(ops.o, b, seq.q_start, r0, rows, h, dim, 1.f, w.o.data());
  const float* lse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_start + r0;
  for (int r = 0; r < rows; ++r) {
    const int64_t at = int64_t{r} * dim;
    delta[r] = lane_dot(w.dout.data() + at, w.o.data() + at, dim);
    lse_log2[r] = lse[r] * kLog2e;
  }
}

// The two-pass plan's query side of one tile: Q, dO and the rows' statistics, held in w.
FUSEDATTN_CPU_HOT RowStats load_query_side(const BwdParams& p, const Operands& ops, int b, int h, const SeqInfo& seq,
                                           int64_t r0, int rows, BackwardScratch& w) {
  compute_row_stats(p, ops, b, h, seq, r0, rows, w, w.delta.data(), w.lse_log2.data());
  load_tile(ops.q, b, seq.q_start, r0, rows, h, p.head_dim, 1.f, w.q.data());
  return {w.delta.data(), w.lse_log2.data()};
}

// Per-row visible columns of key tile [c0, c0 + cols). A row whose LSE is -inf saw no key in the
// forward: its P is 0 everywhere, and exp2(s - (-inf)) must not be evaluated, so it gets none.
void query_tile_ranges(const BwdParams& p, const SeqInfo& seq, int64_t r0, int rows, int64_t c0, int cols,
                       const float* lse_log2, BackwardScratch& w) {
  tile_col_ranges(p, r0, rows, seq.len_q, seq.len_k, c0, cols, w.ranges.data());
  for (int r = 0; r < rows; ++r)
    if (lse_log2[r] == kNegInf) w.ranges[r] = ColRange{0, 0};
}

// With Q, dO (w.q, w.dout) and the key tile's K^T, V^T (w.kt, w.vt) loaded: w.s becomes P =
// exp2(S * scale_log2 - lse) and w.dp becomes dS = P o (dP - delta) on each row's visible columns
// (w.ranges, set here).
FUSEDATTN_CPU_HOT void tile_softmax_gradients(const BwdParams& p, const SeqInfo& seq, const ColumnMask& column_mask,
                                              TileCover cover, int64_t r0, int rows, int64_t c0, int cols,
                                              RowStats stats, BackwardScratch& w) {
  const int dim = p.head_dim;
  query_tile_ranges(p, seq, r0, rows, c0, cols, stats.lse_log2, w);
  matmul_transposed_b(w.q.data(), rows, dim, w.kt.data(), kBlockK, cols, w.s.data(), kBlockK);
  if (cover == TileCover::kPartial) column_mask.hide(r0, rows, c0, cols, w.s.data(), kBlockK);
  matmul_transposed_b(w.dout.data(), rows, dim, w.vt.data(), kBlockK, cols, w.dp.data(), kBlockK);
  for (int r = 0; r < rows; ++r) {
    const ColRange range = w.ranges[r];
    float* __restrict s = w.s.data() + int64_t{r} * kBlockK + range.begin;
    float* __restrict dp = w.dp.data() + int64_t{r} * kBlockK + range.begin;
    const int n = range.end - range.begin;
    exp2_scaled(s, n, p.scale_log2, stats.lse_log2[r]);
    const float delta = stats.delta[r];
    for (int j = 0; j < n; ++j) dp[j] = s[j] * (dp[j] - delta);
  }
}

// The fused plan's rows of one (batch, KV head): the statistics and the fp32 dQ of every query
// row of the group's heads, head by head ([group][len_q] and [group][len_q][dim]).
struct GroupRows {
  std::vector<float> delta, lse_log2, dq;
  int64_t len_q = 0;
  int dim = 0;
  RowStats stats(int group_head, int64_t r0) const {
    const int64_t at = group_head * len_q + r0;
    return {delta.data() + at, lse_log2.data() + at};
  }
  float* dq_rows(int group_head, int64_t r0) { return dq.data() + (group_head * len_q + r0) * dim; }
};

// Bytes of GroupRows for the longest sequence (backward_plan.h weighs them).
int64_t group_row_bytes(const BwdParams& p) {
  const int64_t group = p.heads_q / p.heads_kv;
  return group * p.seqlen_q * (p.head_dim + 2) * int64_t{sizeof(float)};
}

// ---- dK, dV (both plans; with dQ where `group_rows` is given, the fused plan) ---------------
FUSEDATTN_CPU_HOT void key_block_gradients(const BwdParams& p, const Operands& ops, int b, int kv_head, int64_t block,
                                           BackwardScratch& w, GroupRows* group_rows) {
  const SeqInfo seq = seq_info(p, b);
  const int64_t c0 = block * kBlockK;
  if (c0 >= seq.len_k) return;
  const int cols = static_cast<int>(std::min<int64_t>(kBlockK, seq.len_k - c0));
  const int dim = p.head_dim;
  const int group = p.heads_q / p.heads_kv;

  load_tile_transposed(ops.k, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.kt.data());
  load_tile_transposed(ops.v, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.vt.data());
  if (group_rows != nullptr) load_tile(ops.k, b, seq.k_start, c0, cols, kv_head, dim, 1.f, w.k.data());
  float* dk = w.acc_a.data();
  float* dv = w.acc_b.data();
  std::fill(dk, dk + int64_t{cols} * dim, 0.f);
  std::fill(dv, dv + int64_t{cols} * dim, 0.f);

  const int64_t c_last = c0 + cols - 1;
  for (int g = 0; g < group; ++g) {
    const int h = kv_head * group + g;
    const ColumnMask column_mask(p, b, h);
    for (int64_t r0 = 0; r0 < seq.len_q; r0 += kBlockQ) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - r0));
      const KeyRange keys = block_key_range(p, r0, rows, seq.len_q, seq.len_k);
      if (keys.lo > keys.hi || keys.lo > c_last || keys.hi < c0) continue;  // no row sees these keys
      const TileCover cover = column_mask.cover(r0, rows, c0, cols);
      if (cover == TileCover::kAll) continue;

      RowStats stats;
      if (group_rows != nullptr) {
        load_query_tiles(p, ops, b, h, seq, r0, rows, w);
        stats = group_rows->stats(g, r0);
      } else {
        stats = load_query_side(p, ops, b, h, seq, r0, rows, w);
      }
      tile_softmax_gradients(p, seq, column_mask, cover, r0, rows, c0, cols, stats, w);
      accumulate_ptb(w.s.data(), kBlockK, w.ranges.data(), rows, w.dout.data(), dim, cols, dv);
      accumulate_ptb(w.dp.data(), kBlockK, w.ranges.data(), rows, w.q.data(), dim, cols, dk);
      if (group_rows != nullptr)
        accumulate_pb(w.dp.data(), kBlockK, w.ranges.data(), rows, w.k.data(), dim, group_rows->dq_rows(g, r0));
    }
  }
  // Keys no query sees get exact zeros: the accumulators were never touched.
  store_tile(p.dk, p.dk_stride, p.dtype, b, seq.k_start, c0, cols, kv_head, dim, p.scale, dk);
  store_tile(p.dv, p.dv_stride, p.dtype, b, seq.k_start, c0, cols, kv_head, dim, 1.f, dv);
}

// ---- the fused plan: one (batch, KV head) ------------------------------------------------------
FUSEDATTN_CPU_HOT void head_group_gradients(const BwdParams& p, const Operands& ops, int b, int kv_head,
                                            BackwardScratch& w, GroupRows& g_rows) {
  const SeqInfo seq = seq_info(p, b);
  const int group = p.heads_q / p.heads_kv;
  const int dim = p.head_dim;
  g_rows.len_q = seq.len_q;
  g_rows.dim = dim;
  const int64_t rows_total = group * seq.len_q;
  g_rows.delta.resize(static_cast<size_t>(rows_total));
  g_rows.lse_log2.resize(static_cast<size_t>(rows_total));
  g_rows.dq.assign(static_cast<size_t>(rows_total * dim), 0.f);
  const auto row_blocks = [&](auto&& visit) {  // visit(group head, r0, rows) over every query tile
    for (int g = 0; g < group; ++g)
      for (int64_t r0 = 0; r0 < seq.len_q; r0 += kBlockQ)
        visit(g, r0, static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - r0)));
  };
  row_blocks([&](int g, int64_t r0, int rows) {
    const int64_t at = g * seq.len_q + r0;
    compute_row_stats(p, ops, b, kv_head * group + g, seq, r0, rows, w, g_rows.delta.data() + at,
                      g_rows.lse_log2.data() + at);
  });

  const int64_t key_blocks = (seq.len_k + kBlockK - 1) / kBlockK;
  for (int64_t block = 0; block < key_blocks; ++block) key_block_gradients(p, ops, b, kv_head, block, w, &g_rows);

  // Rows no key reaches get exact zeros: their accumulators were never touched.
  row_blocks([&](int g, int64_t r0, int rows) {
    store_tile(p.dq, p.dq_stride, p.dtype, b, seq.q_start, r0, rows, kv_head * group + g, dim, p.scale,
               g_rows.dq_rows(g, r0));
  });
}

// ---- the two-pass plan's query pass: dQ ----------------------------------------------------
FUSEDATTN_CPU_HOT void query_block_gradients(const BwdParams& p, const Operands& ops, int b, int h, int64_t block,
                                             BackwardScratch& w) {
  const SeqInfo seq = seq_info(p, b);
  const int64_t r0 = block * kBlockQ;
  if (r0 >= seq.len_q) return;
  const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - r0));
  const int dim = p.head_dim;
  const int kv_head = h / (p.heads_q / p.heads_kv);

  const RowStats stats = load_query_side(p, ops, b, h, seq, r0, rows, w);
  float* dq = w.acc_a.data();
  std::fill(dq, dq + int64_t{rows} * dim, 0.f);

  const ColumnMask column_mask(p, b, h);
  const KeyRange keys = block_key_range(p, r0, rows, seq.len_q, seq.len_k);
  // The key pass's tiles (multiples of kBlockK), so both plans compute the same scores the same
  // way and fold the same terms into each dQ row.
  for (int64_t c0 = keys.lo / kBlockK * kBlockK; c0 <= keys.hi; c0 += kBlockK) {
    const int cols = static_cast<int>(std::min<int64_t>(kBlockK, seq.len_k - c0));
    const TileCover cover = column_mask.cover(r0, rows, c0, cols);
    if (cover == TileCover::kAll) continue;
    load_tile_transposed(ops.k, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.kt.data());
    load_tile_transposed(ops.v, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.vt.data());
    load_tile(ops.k, b, seq.k_start, c0, cols, kv_head, dim, 1.f, w.k.data());
    tile_softmax_gradients(p, seq, column_mask, cover, r0, rows, c0, cols, stats, w);
    accumulate_pb(w.dp.data(), kBlockK, w.ranges.data(), rows, w.k.data(), dim, dq);
  }
  store_tile(p.dq, p.dq_stride, p.dtype, b, seq.q_start, r0, rows, h, dim, p.scale, dq);
}

}  // namespace

void backward(const BwdParams& p) {
  const Operands ops(p);
  auto make_scratch = [&] { return BackwardScratch(p.head_dim); };
  const int64_t pairs = int64_t{p.batch} * p.heads_kv;

  const int threads = resolve_num_threads(p.num_threads, pairs * ((p.seqlen_k + kBlockK - 1) / kBlockK));
  if (fuses_dq(pairs, threads, group_row_bytes(p))) {
    struct FusedScratch {
      BackwardScratch tiles;
      GroupRows rows;
    };
    parallel_for(pairs, threads, [&] { return FusedScratch{make_scratch(), {}}; },
                 [&](FusedScratch& w, int64_t task) {
                   head_group_gradients(p, ops, static_cast<int>(task / p.heads_kv),
                                        static_cast<int>(task % p.heads_kv), w.tiles, w.rows);
                 });
    return;
  }

  // Key pass. Under a causal mask the first key blocks are seen by the most queries; natural
  // order already hands out the heavy tasks first.
  const int64_t key_blocks = (p.seqlen_k + kBlockK - 1) / kBlockK;
  parallel_for(pairs * key_blocks, p.num_threads, make_scratch, [&](BackwardScratch& w, int64_t task) {
    const int64_t per_batch = key_blocks * p.heads_kv;
    const int b = static_cast<int>(task / per_batch);
    const int kv_head = static_cast<int>(task % per_batch / key_blocks);
    key_block_gradients(p, ops, b, kv_head, task % key_blocks, w, nullptr);
  });

  // Query pass, heavy (last) query blocks first, as in the forward.
  const int64_t query_blocks = (p.seqlen_q + kBlockQ - 1) / kBlockQ;
  parallel_for(int64_t{p.batch} * p.heads_q * query_blocks, p.num_threads, make_scratch,
               [&](BackwardScratch& w, int64_t task) {
                 const int64_t per_batch = query_blocks * p.heads_q;
                 const int b = static_cast<int>(task / per_batch);
                 const int h = static_cast<int>(task % per_batch / query_blocks);
                 query_block_gradients(p, ops, b, h, query_blocks - 1 - task % query_blocks, w);
               });
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
