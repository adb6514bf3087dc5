// append_kv on the CPU backend (kv_cache.h): a sequence's checks, then its rows copied.
#include <cstring>

#include "cpu/cpu_backend.h"
#include "fusedattn/kv_cache.h"

namespace fusedattn::cpu {
namespace {

// Sequence b: its status, and its new tokens' rows where every one of them has a page.
void append_sequence(const AppendParams& p, int b) {
  const auto status = [&](AppendStatus s) { p.status[b] = static_cast<int32_t>(s); };
  if (!append_fits(p, b)) return status(AppendStatus::kPastCache);
  const int64_t first = p.cache_seqlens[b];
  for (int t = 0; t < p.new_tokens; ++t)
    if (append_row(p, b, first + t).page < 0) return status(AppendStatus::kPageOutside);
  const std::size_t row_bytes = static_cast<std::size_t>(p.head_dim) * dtype_size(p.dtype);
  const std::size_t elem = dtype_size(p.dtype);
  // Rows of head dim 0 hold nothing, and views without elements may have no data (memcpy from a
  // null pointer is undefined even for 0 bytes).
  if (row_bytes == 0) return status(AppendStatus::kAppended);
  for (int t = 0; t < p.new_tokens; ++t) {
    const AppendRow at = append_row(p, b, first + t);
    for (int h = 0; h < p.heads; ++h) {
      const auto copy = [&](void* cache, const OperandStrides& cs, const void* src, const OperandStrides& ss) {
        std::memcpy(static_cast<char*>(cache) + (at.page * cs.batch + at.row * cs.row + h * cs.head) * elem,
                    static_cast<const char*>(src) + (int64_t{b} * ss.batch + int64_t{t} * ss.row + h * ss.head) * elem,
                    row_bytes);
      };
      copy(p.k_cache, p.k_cache_stride, p.k, p.k_stride);
      copy(p.v_cache, p.v_cache_stride, p.v, p.v_stride);
    }
  }
  status(AppendStatus::kAppended);
}

}  // namespace

void append_kv(const AppendParams& p) {
  for (int b = 0; b < p.batch; ++b) append_sequence(p, b);
}

}  // namespace fusedattn::cpu
