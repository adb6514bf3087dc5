// Moving tiles between the caller's tensors (any dtype, any int64 strides) and contiguous float
// buffers the compute loops can vectorise over. Every element offset is int64.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/convert.h"
#include "cpu/isa.h"
#include "fusedattn/params.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// One [batch, row, head, dim] operand. `row` is the row within sequence b; `seq_start` is the
// sequence's first row in a packed (varlen) tensor and 0 for dense ones.
// Paged K/V (`paged` set, FwdParams::block_table): the row lies in its page, stride.batch apart,
// and seq_start indexes nothing.
struct Operand {
  const void* data;
  OperandStrides stride;
  DType dtype;
  const FwdParams* paged = nullptr;

  int64_t offset(int b, int64_t seq_start, int64_t row, int head) const {
    if (paged != nullptr)
      return key_page(*paged, b, row) * stride.batch + row % paged->page_size * stride.row + head * stride.head;
    return b * stride.batch + (seq_start + row) * stride.row + head * stride.head;
  }
};

// Converts n contiguous elements of `dtype` at element offset `at` to float, times `mul`.
inline void load_row(const void* data, DType dtype, int64_t at, int n, float mul, float* dst) {
  switch (dtype) {
    case DType::kFloat32: {
      const float* src = static_cast<const float*>(data) + at;
      for (int d = 0; d < n; ++d) dst[d] = src[d] * mul;
      break;
    }
    case DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + at;
      for (int d = 0; d < n; ++d) dst[d] = half_to_float(src[d]) * mul;
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(data) + at;
      for (int d = 0; d < n; ++d) dst[d] = bf16_to_float(src[d]) * mul;
      break;
    }
    default: break;  // the API layer admits only the three types above
  }
}

// Writes n floats times `mul` as `dtype` at element offset `at`.
inline void store_row(void* data, DType dtype, int64_t at, int n, float mul, const float* src) {
  switch (dtype) {
    case DType::kFloat32: {
      float* dst = static_cast<float*>(data) + at;
      for (int d = 0; d < n; ++d) dst[d] = src[d] * mul;
      break;
    }
    case DType::kFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(data) + at;
      for (int d = 0; d < n; ++d) dst[d] = float_to_half(src[d] * mul);
      break;
    }
    case DType::kBFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(data) + at;
      for (int d = 0; d < n; ++d) dst[d] = float_to_bf16(src[d] * mul);
      break;
    }
    default: break;
  }
}

// Rows a tile load asks the cache for ahead of the one it converts. Rows of one head lie a whole
// [head, dim] row of the tensor apart (16 KiB for 32 heads of 128 floats), each only a few cache
// lines long, and a decode step reads every one of them once, from memory, where the hardware
// prefetchers left each row's load waiting. 2-core Zen 5 EPYC, CLI, ms before / 2, 4, 8, 16 rows
// ahead: decode 32 heads, 8k keys, d128 fp32 34-36 / 16.0 / 14.3-14.9 / 14.8 / 16.8; 32/8 heads,
// 32k keys, bf16 24.6-25.0 / - / 11.9-12.0 / 12.0 / 16.0; 32 heads, 16k keys, d64 fp16 104-111 /
// 40.4 / 39.5 / 43 / 49-53; the backward B4 S512 D64 -6%; prefill forwards even.
inline constexpr int kPrefetchRowsAhead = 4;
inline constexpr int kCacheLineBytes = 64;

// The n elements at element offset `at` into the cache (a hint: no fault, no wait).
inline void prefetch_row(const Operand& op, int64_t at, int n) {
  const int64_t element_bytes = op.dtype == DType::kFloat32 ? 4 : 2;  // the API admits fp32, fp16, bf16
  const char* p = static_cast<const char*>(op.data) + at * element_bytes;
  for (int64_t i = 0; i < n * element_bytes; i += kCacheLineBytes) __builtin_prefetch(p + i);
}

// rows x dim tile, row-major with leading dimension `dim`: dst[r * dim + d].
inline void load_tile(const Operand& op, int b, int64_t seq_start, int64_t row0, int rows, int head, int dim,
                      float mul, float* dst) {
  for (int r = 0; r < rows; ++r) {
    if (r + kPrefetchRowsAhead < rows) prefetch_row(op, op.offset(b, seq_start, row0 + r + kPrefetchRowsAhead, head), dim);
    load_row(op.data, op.dtype, op.offset(b, seq_start, row0 + r, head), dim, mul, dst + int64_t{r} * dim);
  }
}

// The same tile transposed, dim x rows with leading dimension `ld` (>= rows): dst[d * ld + r].
// `row_buf` holds one converted row (dim floats).
inline void load_tile_transposed(const Operand& op, int b, int64_t seq_start, int64_t row0, int rows, int head,
                                 int dim, int ld, float* row_buf, float* dst) {
  for (int r = 0; r < rows; ++r) {
    if (r + kPrefetchRowsAhead < rows) prefetch_row(op, op.offset(b, seq_start, row0 + r + kPrefetchRowsAhead, head), dim);
    load_row(op.data, op.dtype, op.offset(b, seq_start, row0 + r, head), dim, 1.f, row_buf);
    for (int d = 0; d < dim; ++d) dst[int64_t{d} * ld + r] = row_buf[d];
  }
}

inline void store_tile(void* data, const OperandStrides& stride, DType dtype, int b, int64_t seq_start, int64_t row0,
                       int rows, int head, int dim, float mul, const float* src) {
  const Operand op{data, stride, dtype};
  for (int r = 0; r < rows; ++r) store_row(data, dtype, op.offset(b, seq_start, row0 + r, head), dim, mul, src + int64_t{r} * dim);
}

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
