// Paged K/V for the tests (Options::block_table): a variable-length case's packed k and v rows
// moved into pages, so one case runs both ways and the paged call can be held to the reference
// and, bit for bit, to the packed call on the same values.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "reference/test_util.h"

namespace fusedattn::testing {

// A table column no sequence's keys reach: never read, so never checked.
constexpr int32_t kUnreachedPage = -1;

struct PagedKV {
  HostTensor k, v;   // [num_pages, page_size, Hkv, D]
  HostTensor table;  // int32 [B, columns]
  int64_t page_size = 0;
};

// Sequence b's keys (its cu_seqlens_k length) fill ceil(len / page_size) pages, taken in a shuffled
// order from num_pages = the pages needed plus `spare_pages`, so neighbours in a sequence are not
// neighbours in memory and some pages belong to no one. Every row that holds no key is NaN (a
// read past a sequence's keys, or of another's page, would show); the table has `extra_columns`
// columns past the longest sequence's pages, all kUnreachedPage, as are a shorter sequence's.
inline PagedKV make_paged(const HostCase& c, int64_t page_size, std::mt19937_64& rng, int64_t spare_pages = 3,
                          int64_t extra_columns = 1) {
  const Problem& p = c.problem;
  const std::vector<int64_t> cu = [&] {
    const auto offsets = p.cu_seqlens_k();
    return std::vector<int64_t>(offsets.begin(), offsets.end());
  }();
  std::vector<int64_t> pages_of(p.batch);
  int64_t needed = 0, widest = 0;
  for (int b = 0; b < p.batch; ++b) {
    pages_of[b] = (cu[b + 1] - cu[b] + page_size - 1) / page_size;
    needed += pages_of[b];
    widest = std::max(widest, pages_of[b]);
  }
  const int64_t num_pages = needed + spare_pages, columns = widest + extra_columns;
  std::vector<int64_t> order(num_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  const int64_t row_elems = int64_t{p.heads_kv} * p.head_dim;
  const std::vector<int64_t> shape = {num_pages, page_size, p.heads_kv, p.head_dim};
  std::vector<double> k(num_pages * page_size * row_elems, std::numeric_limits<double>::quiet_NaN()), v = k;
  std::vector<double> table(p.batch * columns, kUnreachedPage);
  int64_t next = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int64_t j = 0; j < cu[b + 1] - cu[b]; ++j) {
      if (j % page_size == 0) table[b * columns + j / page_size] = static_cast<double>(order[next++]);
      const int64_t page = static_cast<int64_t>(table[b * columns + j / page_size]);
      const int64_t dst = (page * page_size + j % page_size) * row_elems, src = (cu[b] + j) * row_elems;
      std::copy_n(c.values.k.begin() + src, row_elems, k.begin() + dst);
      std::copy_n(c.values.v.begin() + src, row_elems, v.begin() + dst);
    }
  PagedKV paged{HostTensor(c.dtype, shape), HostTensor(c.dtype, shape), HostTensor(DType::kInt32, {p.batch, columns}),
                page_size};
  paged.k.fill(k);
  paged.v.fill(v);
  paged.table.fill(table);
  return paged;
}

// The case's forward reading K/V through the pages.
inline ForwardArgs paged_forward_args(HostCase& c, PagedKV& paged) {
  ForwardArgs a = forward_args(c);
  a.k = paged.k.view();
  a.v = paged.v.view();
  a.options.block_table = paged.table.view();
  return a;
}

}  // namespace fusedattn::testing
