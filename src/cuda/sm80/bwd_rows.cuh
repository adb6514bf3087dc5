// Row-parallel indexing shared by the preprocess and dQ-convert kernels: a group of
// kRowThreads threads per query row, 16-byte chunks of 8 elements.
#pragma once

#include <cstdint>

#include "cuda/sm80/bwd_workspace.h"

namespace fusedattn::cuda::sm80 {

constexpr int kRowThreads = 8;        // threads per query row (a 128-dim row is 2 chunks each)
constexpr int kRowsPerCta = 32;       // rows handled by one CTA
constexpr int kRowCtaThreads = kRowThreads * kRowsPerCta;
constexpr int kChunkElems = 8;        // 16 bytes of fp16/bf16
static_assert(kBwdRowPad % kRowsPerCta == 0, "row CTAs tile the padded rows");
static_assert(kBwdSemRows % kRowsPerCta == 0 || kRowsPerCta % kBwdSemRows == 0, "semaphore granules align with row CTAs");

// Grid: (padded rows / kRowsPerCta, heads_q, batch).
inline dim3 row_grid(const BwdParams& p, const BwdWorkspace& ws) {
  return dim3(static_cast<unsigned>(ws.rows / kRowsPerCta), static_cast<unsigned>(p.heads_q),
              static_cast<unsigned>(p.batch));
}

}  // namespace fusedattn::cuda::sm80
