// CPU decode steps, key by key. The tiled forward (forward.cpp) reads a head's K and V rows one tile
// at a time, rows a whole [heads, dim] row of the tensor apart (16 KiB for 32 heads of 128 floats)
// and each only a few cache lines long: a decode step, which reads every row once from memory, ran
// at ~20 GB/s on two Zen 5 cores that stream 31-39 GB/s. Here a task takes every head of one
// sequence over a part of its keys and reads a key's rows of all KV heads, which lie side by side,
// together, so K and V are read in order:
//   for each tile of keys:  S[h][j] = q_h . k_{j, kv(h)}         (4 keys a step)
//                           online softmax per head over the tile
//                           O[h] += sum_j P[h][j] v_{j, kv(h)}    (4 keys a step)
// A GQA group's query heads read their KV head's rows where they lie, so no K or V row is read
// twice. Few sequences over many keys split the keys into parts (key_parts.h). docs/perf.md
// (fifty-fourth session) has the measurements behind the step and the prefetch.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cpu/config.h"
#include "cpu/decode.h"
#include "cpu/isa.h"
#include "cpu/key_parts.h"
#include "cpu/mask.h"
#include "cpu/simd.h"
#include "cpu/softmax.h"
#include "cpu/threads.h"
#include "cpu/tile_io.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {
namespace {

// Keys whose scores the softmax folds in at once: the scores of every head for them stay in L1.
constexpr int kKeysPerTile = kBlockK;
// Keys whose rows one step of the score and value loops reads together (score_keys, add_values).
constexpr int kKeysPerStep = 4;
static_assert(kKeysPerTile % kKeysPerStep == 0, "a whole tile is whole steps");

// Per-thread working set: the query rows, output rows and scores of every head of one sequence.
struct DecodeScratch {
  explicit DecodeScratch(const FwdParams& p)
      : q(static_cast<size_t>(p.heads_q) * p.head_dim),
        o(static_cast<size_t>(p.heads_q) * p.head_dim),
        s(static_cast<size_t>(p.heads_q) * kKeysPerTile),
        converted(static_cast<size_t>(kKeysPerStep) * p.heads_kv * p.head_dim),
        softmax(static_cast<size_t>(p.heads_q)),
        lse(static_cast<size_t>(p.heads_q)) {}
  std::vector<float> q;          // [heads_q][dim], pre-multiplied by scale * log2(e)
  std::vector<float> o;          // [heads_q][dim], the output accumulators
  std::vector<float> s;          // [heads_q][kKeysPerTile], scores, then probabilities
  std::vector<float> converted;  // a step's keys' K or V rows of every KV head, converted to float
  std::vector<RowSoftmax> softmax;
  std::vector<float> lse;        // [heads_q]
};

// v's lanes rotated down by kShift: lane l gets lane (l + kShift) % kVecWidth.
template <int kShift, size_t... kLane>
FUSEDATTN_CPU_INLINE Vec rotate_lanes(Vec v, std::index_sequence<kLane...>) {
  return __builtin_shufflevector(v, v, ((kLane + kShift) % kVecWidth)...);
}

// The sum of v's lanes, folded in halves: log2(kVecWidth) shuffles and adds rather than a chain of
// kVecWidth dependent scalar adds for each of a step's dots.
template <int kHalf = kVecWidth / 2>
FUSEDATTN_CPU_INLINE float sum_lanes(Vec v) {
  if constexpr (kHalf == 0) {
    return v[0];
  } else {
    return sum_lanes<kHalf / 2>(v + rotate_lanes<kHalf>(v, std::make_index_sequence<kVecWidth>{}));
  }
}

// One sequence's K and V as the key steps read them.
struct SequenceKeys {
  Operand k, v;
  int b;
  int64_t seq_start;
  int dim, heads, group, kv_elements;  // kv_elements: one key's rows of every KV head
  int64_t element_bytes;               // of K and V's dtype
  int64_t last;                        // the last key this part reads
};

// The next step's rows of K or V on their way into the cache while this step computes: the
// hardware prefetchers did not follow a step's rows, each read a head's slice at a time (with 4
// rows a step, GQA fp32 decode ran 1.4x slower than one row at a time without this). The lines
// are spread over the step's heads, a slice per head, so that no burst fills the miss queue.
template <int kKeys>
struct NextRows {
  const char* rows[kKeys];
  int count = 0;
  int64_t lines = 0;  // cache lines per row

  NextRows(const Operand& op, const SequenceKeys& keys, int64_t key) {
    const int64_t element_bytes = keys.element_bytes;
    lines = (keys.kv_elements * element_bytes + kCacheLineBytes - 1) / kCacheLineBytes;
    const int64_t next = key + kKeys;
    const char* data = static_cast<const char*>(op.data);
    for (; count < kKeys && next + count <= keys.last; ++count)
      rows[count] = data + op.offset(keys.b, keys.seq_start, next + count, 0) * element_bytes;
  }
  // Head h's slice of every row.
  FUSEDATTN_CPU_INLINE void fetch_slice(int h, int heads) const {
    const int64_t begin = lines * h / heads, end = lines * (h + 1) / heads;
    for (int r = 0; r < count; ++r)
      for (int64_t line = begin; line < end; ++line) __builtin_prefetch(rows[r] + line * kCacheLineBytes);
  }
};

// Key `key`'s rows of every KV head as floats: in place where they are fp32, else converted into
// `buffer`.
FUSEDATTN_CPU_INLINE const float* key_rows(const Operand& op, const SequenceKeys& keys, int64_t key, float* buffer) {
  const int64_t at = op.offset(keys.b, keys.seq_start, key, 0);
  if (op.dtype == DType::kFloat32) return static_cast<const float*>(op.data) + at;
  load_row(op.data, op.dtype, at, keys.kv_elements, 1.f, buffer);
  return buffer;
}

// A step's keys' rows of every KV head of K or V (key_rows), and the next step's on their way.
template <int kKeys>
struct StepRows {
  const float* rows[kKeys];
  NextRows<kKeys> next;
  StepRows(const Operand& op, const SequenceKeys& keys, int64_t key, float* buffer) : next(op, keys, key) {
    for (int j = 0; j < kKeys; ++j) rows[j] = key_rows(op, keys, key + j, buffer + int64_t{j} * keys.kv_elements);
  }
};

// Keys [key, key + kKeys): each head's scores, s[h * kKeysPerTile + j] = q_h . k_{key + j}. Each
// query vector load serves kKeys keys, so the query rows (16 KiB for 32 heads of 128 floats) are
// read from L1 once per step rather than once per key.
template <int kKeys>
FUSEDATTN_CPU_INLINE void score_keys(const SequenceKeys& keys, int64_t key, float* s, DecodeScratch& w) {
  const StepRows<kKeys> step(keys.k, keys, key, w.converted.data());
  const float* const* rows = step.rows;
  for (int h = 0; h < keys.heads; ++h) {
    step.next.fetch_slice(h, keys.heads);
    const float* q = w.q.data() + int64_t{h} * keys.dim;
    const int64_t head_at = int64_t{h / keys.group} * keys.dim;
    Vec acc[kKeys] = {};
    int d = 0;
    for (; d + kVecWidth <= keys.dim; d += kVecWidth) {
      const Vec x = load_vec(q + d);
      for (int j = 0; j < kKeys; ++j) acc[j] += x * load_vec(rows[j] + head_at + d);
    }
    for (int j = 0; j < kKeys; ++j) {
      float total = sum_lanes(acc[j]);
      for (int e = d; e < keys.dim; ++e) total += q[e] * rows[j][head_at + e];
      s[int64_t{h} * kKeysPerTile + j] = total;
    }
  }
}

// Keys [key, key + kKeys): O[h] += sum_j p[h * kKeysPerTile + j] v_{key + j}, keys folded in
// order, each output vector loaded and stored once per step.
template <int kKeys>
FUSEDATTN_CPU_INLINE void add_values(const SequenceKeys& keys, int64_t key, const float* p, DecodeScratch& w) {
  const StepRows<kKeys> step(keys.v, keys, key, w.converted.data());
  const float* const* rows = step.rows;
  for (int h = 0; h < keys.heads; ++h) {
    step.next.fetch_slice(h, keys.heads);
    float* o = w.o.data() + int64_t{h} * keys.dim;
    const float* ph = p + int64_t{h} * kKeysPerTile;
    const int64_t head_at = int64_t{h / keys.group} * keys.dim;
    int d = 0;
    for (; d + kVecWidth <= keys.dim; d += kVecWidth) {
      Vec acc = load_vec(o + d);
      for (int j = 0; j < kKeys; ++j) acc += ph[j] * load_vec(rows[j] + head_at + d);
      store_vec(o + d, acc);
    }
    for (; d < keys.dim; ++d) {
      float acc = o[d];
      for (int j = 0; j < kKeys; ++j) acc += ph[j] * rows[j][head_at + d];
      o[d] = acc;
    }
  }
}

// Part `part` of `parts` of sequence b's keys against its query row of every head: w.o gets each
// head's output normalised over those keys, w.lse its LSE. False where the sequence has no query
// row (a variable-length batch's empty sequence).
FUSEDATTN_CPU_HOT bool attend_part(const FwdParams& p, int b, int part, int parts, DecodeScratch& w) {
  const SeqInfo seq = seq_info(p, b);
  if (seq.len_q == 0) return false;
  const int dim = p.head_dim, heads = p.heads_q;
  const Operand q{p.q, p.q_stride, p.dtype};
  const FwdParams* paged = p.block_table != nullptr ? &p : nullptr;
  SequenceKeys seq_keys{{p.k, p.k_stride, p.dtype, paged}, {p.v, p.v_stride, p.dtype, paged}, b, seq.k_start,
                        dim, heads, p.heads_q / p.heads_kv, p.heads_kv * dim,
                        static_cast<int64_t>(dtype_size(p.dtype)), /*last=*/0};

  for (int h = 0; h < heads; ++h)
    load_row(q.data, q.dtype, q.offset(b, seq.q_start, 0, h), dim, p.scale_log2, w.q.data() + int64_t{h} * dim);
  std::fill(w.o.begin(), w.o.end(), 0.f);
  std::fill(w.softmax.begin(), w.softmax.end(), RowSoftmax{});

  const KeyRange keys = part_of(key_range(p, 0, seq.len_q, seq.len_k), part, parts);
  seq_keys.last = keys.hi;
  for (int64_t c0 = keys.lo; c0 <= keys.hi; c0 += kKeysPerTile) {
    const int cols = static_cast<int>(std::min<int64_t>(kKeysPerTile, keys.hi - c0 + 1));
    int j = 0;
    for (; j + kKeysPerStep <= cols; j += kKeysPerStep)
      score_keys<kKeysPerStep>(seq_keys, c0 + j, w.s.data() + j, w);
    for (; j < cols; ++j) score_keys<1>(seq_keys, c0 + j, w.s.data() + j, w);
    for (int h = 0; h < heads; ++h) {
      const float rescale = w.softmax[h].update(w.s.data() + int64_t{h} * kKeysPerTile, ColRange{0, cols});
      if (rescale != 1.f) {
        float* o_row = w.o.data() + int64_t{h} * dim;
        for (int d = 0; d < dim; ++d) o_row[d] *= rescale;
      }
    }
    for (j = 0; j + kKeysPerStep <= cols; j += kKeysPerStep)
      add_values<kKeysPerStep>(seq_keys, c0 + j, w.s.data() + j, w);
    for (; j < cols; ++j) add_values<1>(seq_keys, c0 + j, w.s.data() + j, w);
  }

  for (int h = 0; h < heads; ++h) {
    float* o_row = w.o.data() + int64_t{h} * dim;
    const float inv = w.softmax[h].inverse_sum();
    for (int d = 0; d < dim; ++d) o_row[d] *= inv;
    w.lse[h] = w.softmax[h].lse();
  }
  return true;
}

// Sequence b's output row and LSE of every head, from w.o and w.lse.
void store_rows(const FwdParams& p, int b, const DecodeScratch& w) {
  const SeqInfo seq = seq_info(p, b);
  const Operand o{p.o, p.o_stride, p.dtype};
  for (int h = 0; h < p.heads_q; ++h)
    store_row(p.o, p.dtype, o.offset(b, seq.q_start, 0, h), p.head_dim, 1.f, w.o.data() + int64_t{h} * p.head_dim);
  if (p.lse != nullptr)
    for (int h = 0; h < p.heads_q; ++h) p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + seq.q_start] = w.lse[h];
}

}  // namespace

void decode_by_key_rows(const FwdParams& p) {
  const auto scratch = [&] { return DecodeScratch(p); };
  const int parts = split_parts(p.batch, p.seqlen_k);
  if (parts == 1) {
    parallel_for(p.batch, p.num_threads, scratch, [&](DecodeScratch& w, int64_t b) {
      if (attend_part(p, static_cast<int>(b), 0, 1, w)) store_rows(p, static_cast<int>(b), w);
    });
    return;
  }
  PartRows part_rows(p.batch, parts, p.heads_q, p.head_dim);
  parallel_for(int64_t{p.batch} * parts, p.num_threads, scratch, [&](DecodeScratch& w, int64_t item) {
    const int b = static_cast<int>(item / parts), part = static_cast<int>(item % parts);
    if (attend_part(p, b, part, parts, w)) part_rows.save(b, part, p.heads_q, w.o.data(), w.lse.data());
  });
  parallel_for(p.batch, p.num_threads, scratch, [&](DecodeScratch& w, int64_t b) {
    if (seq_info(p, static_cast<int>(b)).len_q == 0) return;
    part_rows.combine(b, p.heads_q, w.o.data(), w.lse.data());
    store_rows(p, static_cast<int>(b), w);
  });
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
