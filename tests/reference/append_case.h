// A decode step for append_kv (fusedattn/kv_cache.h) on the host: caches and new tokens of fresh
// values, per-sequence or paged through a shuffled table, and what append_kv must leave, worked
// out element by element from the rules (a sequence is written whole or not at all). The CPU and
// GPU suites run it on their backends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "fusedattn/kv_cache.h"

namespace fusedattn::testing {

struct AppendCase {
  int batch = 0, new_tokens = 0, heads = 0, dim = 0;
  int64_t page_size = 0;  // rows per page; unpaged: each sequence's cache length
  int64_t pages = 0;      // the table's columns (unpaged: 1)
  int64_t num_pages = 0;  // pool pages (unpaged: batch)
  bool paged = false;
  std::vector<float> k_cache, v_cache, k, v;  // fp32 values: any bits are moved as they are
  std::vector<int32_t> lengths, table;

  AppendCase(std::vector<int32_t> lens, int new_count, int head_count, int head_dim, int64_t page, int64_t cols,
             bool use_table, std::mt19937_64& rng)
      : batch(static_cast<int>(lens.size())), new_tokens(new_count), heads(head_count), dim(head_dim),
        page_size(page), pages(use_table ? cols : 1), paged(use_table), lengths(std::move(lens)) {
    num_pages = paged ? batch * pages + 2 : batch;  // two spare pages no sequence names
    std::normal_distribution<float> normal;
    for (auto* t : {&k_cache, &v_cache}) {
      t->resize(static_cast<size_t>(num_pages * page_size * heads * dim));
      for (float& x : *t) x = normal(rng);
    }
    for (auto* t : {&k, &v}) {
      t->resize(static_cast<size_t>(int64_t{batch} * new_tokens * heads * dim));
      for (float& x : *t) x = normal(rng);
    }
    if (paged) {
      std::vector<int32_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      table.assign(order.begin(), order.begin() + batch * pages);
    }
  }

  TensorView view4(std::vector<float>& t, int64_t d0, int64_t d1) {
    return TensorView::contiguous(t.data(), DType::kFloat32, {d0, d1, heads, dim});
  }
  AppendKvArgs args(std::vector<int32_t>& status) {
    AppendKvArgs a;
    a.k_cache = view4(k_cache, num_pages, page_size);
    a.v_cache = view4(v_cache, num_pages, page_size);
    a.k = view4(k, batch, new_tokens);
    a.v = view4(v, batch, new_tokens);
    a.cache_seqlens = TensorView::contiguous(lengths.data(), DType::kInt32, {batch});
    if (paged) a.block_table = TensorView::contiguous(table.data(), DType::kInt32, {batch, pages});
    status.assign(static_cast<size_t>(batch), -7);
    a.status = TensorView::contiguous(status.data(), DType::kInt32, {batch});
    return a;
  }

  // The caches append_kv must leave, and each sequence's status.
  void expected(std::vector<float>& k_out, std::vector<float>& v_out, std::vector<int32_t>& status) const {
    k_out = k_cache;
    v_out = v_cache;
    status.assign(static_cast<size_t>(batch), static_cast<int32_t>(AppendStatus::kAppended));
    const int64_t positions = page_size * pages;
    for (int b = 0; b < batch; ++b) {
      const int64_t n = lengths[b];
      if (n < 0 || n + new_tokens > positions) {
        status[b] = static_cast<int32_t>(AppendStatus::kPastCache);
        continue;
      }
      const auto page_of = [&](int64_t pos) -> int64_t {
        return paged ? table[static_cast<size_t>(b * pages + pos / page_size)] : b;
      };
      bool inside = true;
      for (int t = 0; t < new_tokens; ++t) inside &= page_of(n + t) >= 0 && page_of(n + t) < num_pages;
      if (!inside) {
        status[b] = static_cast<int32_t>(AppendStatus::kPageOutside);
        continue;
      }
      for (int t = 0; t < new_tokens; ++t) {
        const int64_t row = page_of(n + t) * page_size + (n + t) % page_size;
        const int64_t src = (int64_t{b} * new_tokens + t) * heads * dim, dst = row * heads * dim;
        std::copy_n(k.begin() + src, heads * dim, k_out.begin() + dst);
        std::copy_n(v.begin() + src, heads * dim, v_out.begin() + dst);
      }
    }
  }
};

}  // namespace fusedattn::testing
