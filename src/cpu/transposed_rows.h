// K of every (sequence, KV head) converted to float and transposed once per call, for the
// forward's score product (S = Q K^T reads K as [d][key] tiles). Transposed tile by tile instead,
// every task that visits a key tile redoes it: 12% of a B1 H8 S1024 D64 forward (this 2-core
// machine, fifty-first session). Made only where several tasks read each key tile (the query
// blocks of a head, the query heads of a KV head) and the copy stays small; a decode step reads
// each tile once and transposes it in cache. (The backward's query pass, given copies of K and V
// the same way, read even to 9% slower: not used there.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "cpu/config.h"
#include "cpu/copy_storage.h"
#include "cpu/isa.h"
#include "cpu/threads.h"
#include "cpu/tile_io.h"
#include "cpu/tile_math.h"
#include "fusedattn/params.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// A transposed key tile: row d (of the head dim) at data + d * ld.
struct TransposedTile {
  const float* data;
  int ld;
};

class TransposedRows {
 public:
  static constexpr int64_t kMaxFloats = int64_t{16} << 20;  // 64 MiB
  static constexpr int kMinReaders = 2;                       // tasks per key tile

  TransposedRows() = default;  // none: each task transposes its own tiles

  // op's rows of every (sequence, KV head), when `readers` tasks read each key tile.
  TransposedRows(const FwdParams& p, const Operand& op, int64_t readers) : dim_(p.head_dim), heads_(p.heads_kv) {
    if (readers < kMinReaders || p.batch == 0) return;
    ld_.resize(static_cast<size_t>(p.batch));
    start_.assign(static_cast<size_t>(p.batch) + 1, 0);
    for (int b = 0; b < p.batch; ++b) {
      ld_[b] = round_up(static_cast<int>(seq_info(p, b).len_k), kColsPerPass) + kRowSkew;
      start_[b + 1] = start_[b] + int64_t{heads_} * dim_ * ld_[b];
    }
    if (start_.back() > kMaxFloats) {
      start_.clear();
      return;
    }
    rows_.emplace(static_cast<size_t>(start_.back() + kTailPadding));
    parallel_for(int64_t{p.batch} * heads_, p.num_threads,
                 [&] { return std::vector<float>(static_cast<size_t>(kRowsAtOnce) * dim_); },
                 [&](std::vector<float>& buf, int64_t item) {
                   const int b = static_cast<int>(item / heads_), h = static_cast<int>(item % heads_);
                   transpose(op, b, h, seq_info(p, b), buf.data());
                 });
  }

  // Keys [c0, c0 + cols) of sequence b (starting at row k_start of op), KV head h: from the copy, or
  // else transposed into `tile` (dim x kBlockK floats; row_buf: one row's dim floats).
  TransposedTile tile(const Operand& op, int b, int64_t k_start, int64_t c0, int cols, int h, int dim,
                      float* row_buf, float* tile) const {
    if (start_.empty()) {
      load_tile_transposed(op, b, k_start, c0, cols, h, dim, kBlockK, row_buf, tile);
      return {tile, kBlockK};
    }
    return {rows_->data() + start_[b] + int64_t{h} * dim_ * ld_[b] + c0, ld_[b]};
  }

  // Whether the tiles come from the copy (and not from op's rows, read tile by tile).
  bool copied() const { return !start_.empty(); }

 private:
  static constexpr int kRowsAtOnce = 16;  // keys converted together, so each d's stores are contiguous
  // Rows a cache line (tile_io.h) longer than the keys: with rows of a power of two (1024 keys:
  // 4 KiB) a tile's rows all fell into one L1 set.
  static constexpr int kRowSkew = kCacheLineBytes / static_cast<int>(sizeof(float));
  // Floats past the last row. A tile that starts off the score product's pass grid (a window's
  // first visible key) ends its last pass up to kColsPerPass - 1 floats past its last key, further
  // than a row's tail reaches where kColsPerPass exceeds kRowSkew (the AVX-512 build's 32): into the
  // next row, never used, or past the copy's last row, out of its allocation (ASan, the CLI's
  // --window 3,2: mended).
  static constexpr int kTailPadding = kColsPerPass;

  void transpose(const Operand& op, int b, int h, const SeqInfo& seq, float* buf) {
    float* dst = rows_->data() + start_[b] + int64_t{h} * dim_ * ld_[b];
    for (int64_t r0 = 0; r0 < seq.len_k; r0 += kRowsAtOnce) {
      const int n = static_cast<int>(std::min<int64_t>(kRowsAtOnce, seq.len_k - r0));
      for (int i = 0; i < n; ++i)
        load_row(op.data, op.dtype, op.offset(b, seq.k_start, r0 + i, h), dim_, 1.f, buf + int64_t{i} * dim_);
      for (int d = 0; d < dim_; ++d)
        for (int i = 0; i < n; ++i) dst[int64_t{d} * ld_[b] + r0 + i] = buf[int64_t{i} * dim_ + d];
    }
  }

  int dim_ = 0, heads_ = 0;
  // Sequence b's row length: its keys, rounded up to kColsPerPass, plus the skew. The tails past
  // the keys are never written: the score product's last pass reads them into scores no row uses
  // (matmul_transposed_b), as the tiles transposed one at a time leave theirs.
  std::vector<int> ld_;
  std::vector<int64_t> start_;  // sequence b's floats begin at start_[b]; empty: no copy
  std::optional<CopyStorage> rows_;
};

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
