// CPU backward: P is recomputed tile by tile from the saved LSE, never stored. Two passes, each
// of whose tasks owns the gradient rows it writes, so no two threads ever touch the same output
// and the result is bit-identical run to run (`deterministic` is therefore always honoured):
//   1. key pass,   one task per (batch, KV head, key block): dK and dV for those keys, summed
//      over every query head of the GQA group and every query block that sees the keys;
//   2. query pass, one task per (batch, query head, query block): dQ for those rows.
// The query pass recomputes S and dP once more (7 tile products instead of 5), which buys full
// parallelism for MQA/GQA and O(block) memory per thread with no atomics or N x D accumulators.
#include <algorithm>
#include <cstdint>
#include <vector>

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

// Loads Q, dO of query rows [r0, r0 + rows) of head h, and their per-row delta and LSE.
FUSEDATTN_CPU_HOT void load_query_side(const BwdParams& p, const Operands& ops, int b, int h, const SeqInfo& seq,
                                       int64_t r0, int rows, BackwardScratch& w) {
  const int dim = p.head_dim;
  load_tile(ops.q, b, seq.q_start, r0, rows, h, dim, 1.f, w.q.data());
  load_tile(ops.dout, b, seq.q_start, r0, rows, h, dim, 1.f, w.dout.data());
  load_tile(ops.o, b, seq.q_start, r0, rows, h, dim, 1.f, w.o.data());
  const float* lse = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_start + r0;
  for (int r = 0; r < rows; ++r) {
    const int64_t at = int64_t{r} * dim;
    w.delta[r] = lane_dot(w.dout.data() + at, w.o.data() + at, dim);
    w.lse_log2[r] = lse[r] * kLog2e;
  }
}

// Per-row visible columns of key tile [c0, c0 + cols). A row whose LSE is -inf saw no key in the
// forward: its P is 0 everywhere, and exp2(s - (-inf)) must not be evaluated, so it gets none.
void query_tile_ranges(const BwdParams& p, const SeqInfo& seq, int64_t r0, int rows, int64_t c0, int cols,
                       BackwardScratch& w) {
  tile_col_ranges(p, r0, rows, seq.len_q, seq.len_k, c0, cols, w.ranges.data());
  for (int r = 0; r < rows; ++r)
    if (w.lse_log2[r] == kNegInf) w.ranges[r] = ColRange{0, 0};
}

// With S (w.s) and dP (w.dp) computed for a tile: w.s becomes P = exp2(S * scale_log2 - lse),
// w.dp becomes dS = P o (dP - delta), on each row's visible columns.
FUSEDATTN_CPU_HOT void softmax_gradients(const BwdParams& p, int rows, BackwardScratch& w) {
  for (int r = 0; r < rows; ++r) {
    const ColRange range = w.ranges[r];
    float* __restrict s = w.s.data() + int64_t{r} * kBlockK + range.begin;
    float* __restrict dp = w.dp.data() + int64_t{r} * kBlockK + range.begin;
    const int n = range.end - range.begin;
    exp2_scaled(s, n, p.scale_log2, w.lse_log2[r]);
    const float delta = w.delta[r];
    for (int j = 0; j < n; ++j) dp[j] = s[j] * (dp[j] - delta);
  }
}

// ---- pass 1: dK, dV ------------------------------------------------------------------------
FUSEDATTN_CPU_HOT void key_block_gradients(const BwdParams& p, const Operands& ops, int b, int kv_head, int64_t block,
                         BackwardScratch& w) {
  const SeqInfo seq = seq_info(p, b);
  const int64_t c0 = block * kBlockK;
  if (c0 >= seq.len_k) return;
  const int cols = static_cast<int>(std::min<int64_t>(kBlockK, seq.len_k - c0));
  const int dim = p.head_dim;
  const int group = p.heads_q / p.heads_kv;

  load_tile_transposed(ops.k, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.kt.data());
  load_tile_transposed(ops.v, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.vt.data());
  float* dk = w.acc_a.data();
  float* dv = w.acc_b.data();
  std::fill(dk, dk + int64_t{cols} * dim, 0.f);
  std::fill(dv, dv + int64_t{cols} * dim, 0.f);

  const int64_t c_last = c0 + cols - 1;
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    const ColumnMask column_mask(p, b, h);
    for (int64_t r0 = 0; r0 < seq.len_q; r0 += kBlockQ) {
      const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - r0));
      const KeyRange keys = block_key_range(p, r0, rows, seq.len_q, seq.len_k);
      if (keys.lo > keys.hi || keys.lo > c_last || keys.hi < c0) continue;  // no row sees these keys
      const TileCover cover = column_mask.cover(r0, rows, c0, cols);
      if (cover == TileCover::kAll) continue;

      load_query_side(p, ops, b, h, seq, r0, rows, w);
      query_tile_ranges(p, seq, r0, rows, c0, cols, w);
      matmul_transposed_b(w.q.data(), rows, dim, w.kt.data(), kBlockK, cols, w.s.data(), kBlockK);
      if (cover == TileCover::kPartial) column_mask.hide(r0, rows, c0, cols, w.s.data(), kBlockK);
      matmul_transposed_b(w.dout.data(), rows, dim, w.vt.data(), kBlockK, cols, w.dp.data(), kBlockK);
      softmax_gradients(p, rows, w);
      accumulate_ptb(w.s.data(), kBlockK, w.ranges.data(), rows, w.dout.data(), dim, cols, dv);
      accumulate_ptb(w.dp.data(), kBlockK, w.ranges.data(), rows, w.q.data(), dim, cols, dk);
    }
  }
  // Keys no query sees get exact zeros: the accumulators were never touched.
  store_tile(p.dk, p.dk_stride, p.dtype, b, seq.k_start, c0, cols, kv_head, dim, p.scale, dk);
  store_tile(p.dv, p.dv_stride, p.dtype, b, seq.k_start, c0, cols, kv_head, dim, 1.f, dv);
}

// ---- pass 2: dQ ----------------------------------------------------------------------------
FUSEDATTN_CPU_HOT void query_block_gradients(const BwdParams& p, const Operands& ops, int b, int h, int64_t block,
                           BackwardScratch& w) {
  const SeqInfo seq = seq_info(p, b);
  const int64_t r0 = block * kBlockQ;
  if (r0 >= seq.len_q) return;
  const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, seq.len_q - r0));
  const int dim = p.head_dim;
  const int kv_head = h / (p.heads_q / p.heads_kv);

  load_query_side(p, ops, b, h, seq, r0, rows, w);
  float* dq = w.acc_a.data();
  std::fill(dq, dq + int64_t{rows} * dim, 0.f);

  const ColumnMask column_mask(p, b, h);
  const KeyRange keys = block_key_range(p, r0, rows, seq.len_q, seq.len_k);
  for (int64_t c0 = keys.lo; c0 <= keys.hi; c0 += kBlockK) {
    const int cols = static_cast<int>(std::min<int64_t>(kBlockK, keys.hi - c0 + 1));
    const TileCover cover = column_mask.cover(r0, rows, c0, cols);
    if (cover == TileCover::kAll) continue;
    query_tile_ranges(p, seq, r0, rows, c0, cols, w);
    load_tile_transposed(ops.k, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.kt.data());
    load_tile_transposed(ops.v, b, seq.k_start, c0, cols, kv_head, dim, kBlockK, w.row.data(), w.vt.data());
    load_tile(ops.k, b, seq.k_start, c0, cols, kv_head, dim, 1.f, w.k.data());
    matmul_transposed_b(w.q.data(), rows, dim, w.kt.data(), kBlockK, cols, w.s.data(), kBlockK);
    if (cover == TileCover::kPartial) column_mask.hide(r0, rows, c0, cols, w.s.data(), kBlockK);
    matmul_transposed_b(w.dout.data(), rows, dim, w.vt.data(), kBlockK, cols, w.dp.data(), kBlockK);
    softmax_gradients(p, rows, w);
    accumulate_pb(w.dp.data(), kBlockK, w.ranges.data(), rows, w.k.data(), dim, dq);
  }
  store_tile(p.dq, p.dq_stride, p.dtype, b, seq.q_start, r0, rows, h, dim, p.scale, dq);
}

}  // namespace

void backward(const BwdParams& p) {
  const Operands ops(p);
  auto make_scratch = [&] { return BackwardScratch(p.head_dim); };

  // Key pass. Under a causal mask the first key blocks are seen by the most queries; natural
  // order already hands out the heavy tasks first.
  const int64_t key_blocks = (p.seqlen_k + kBlockK - 1) / kBlockK;
  parallel_for(int64_t{p.batch} * p.heads_kv * key_blocks, p.num_threads, make_scratch,
               [&](BackwardScratch& w, int64_t task) {
                 const int64_t per_batch = key_blocks * p.heads_kv;
                 const int b = static_cast<int>(task / per_batch);
                 const int kv_head = static_cast<int>(task % per_batch / key_blocks);
                 key_block_gradients(p, ops, b, kv_head, task % key_blocks, w);
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
