// Flash-Decoding on the portable forward: a full-mask launch of fewer CTAs than the GPU holds at
// once (decoding: one query tile per (sequence, KV head) over a long cache) leaves most SMs idle
// while each CTA walks every key block alone. Such a launch cuts each tile's key blocks into
// `parts` ranges, one CTA each; every part writes its normalised fp32 O rows and their LSE to a
// workspace, and a second kernel (fwd_split_combine.cu) combines the parts of each row in part
// order, so the result does not depend on which part ran first:
//   m = max_p lse_p,  w_p = exp(lse_p - m),  O = sum_p w_p O_p / sum_p w_p,  lse = m + log(sum_p w_p).
// A part whose range holds none of its sequence's keys (a shorter sequence of a variable-length
// batch) writes lse = -inf and weighs nothing; a row with no key in any part gets 0 and -inf.
// FUSEDATTN_SM80_KV_SPLIT=0 turns the split off (A/B measurements).
#pragma once

#include <cstdint>

#include "cuda/common/env.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm80 {

// The workspace of a split launch. Row r of head h (r: b * seqlen_q + i for dense batches, the
// packed row times view_group plus i for variable-length ones, FwdParams::view_group) of part p
// sits at ((p * heads_q + h) * rows + r).
struct KvSplit {
  int parts = 1;
  int heads = 0;         // heads_q
  int64_t rows = 0;      // query rows per head
  int o_cols = 0;        // floats per O row: the instance's head dim
  float* o = nullptr;    // [parts][heads][rows][o_cols]
  float* lse = nullptr;  // [parts][heads][rows]

  FUSEDATTN_HD int64_t slot(int part, int head, int64_t row) const {
    return (int64_t{part} * heads + head) * rows + row;
  }
};

// Each part pays a tile's fixed costs (Q load, the first block's wait, its O and LSE written and
// read back), so parts get at least this many keys; and at most kMaxKvParts parts, which the
// combine reads per row.
constexpr int kMinKeysPerPart = 512;
constexpr int kMaxKvParts = 32;

// Parts per tile for a full-mask launch of `ctas` tiles over at most `keys` keys per sequence, on
// `slots` CTAs the GPU holds at once: enough to fill those slots, 1 (no split) for launches that
// fill them already or are too short to share.
inline int kv_split_parts(int64_t ctas, int64_t keys, int64_t slots) {
  if (ctas <= 0 || ctas >= slots) return 1;
  const int64_t by_slots = slots / ctas, by_keys = keys / kMinKeysPerPart;
  const int64_t parts = by_slots < by_keys ? by_slots : by_keys;
  return static_cast<int>(parts < 2 ? 1 : (parts > kMaxKvParts ? kMaxKvParts : parts));
}

// The view of params that the portable forward launches: a grouped decode's query heads as rows
// of one head, read as strided rows, so ragged and paged decodes take it too
// (FUSEDATTN_SM80_DECODE_ROWS=0 launches them head by head, for A/B measurements).
inline FwdParams launch_view(const FwdParams& params) {
  return env_switch_or("FUSEDATTN_SM80_DECODE_ROWS", true) ? decode_groups_as_rows(params, /*strided_rows=*/true)
                                                           : params;
}

// The parts each tile's keys are cut into in a full-mask launch of p (a launch view) in tiles of
// block_m query rows, ctas_per_sm CTAs to an SM: kv_split_parts over the GPU's slots, 1 where
// FUSEDATTN_SM80_KV_SPLIT=0. The tests assert with it that a launch splits.
int kv_split_parts_for(const FwdParams& p, int block_m, int ctas_per_sm);

// The split of that launch on an instance of head dim o_cols, with its workspace in p.stream's
// buffer (common/stream_buffer.h): parts == 1 where kv_split_parts_for says so, or where the
// buffer would have to grow during a graph capture.
KvSplit plan_kv_split(const FwdParams& p, int block_m, int ctas_per_sm, int o_cols);

// Combines a split launch's parts into p's O and LSE (fwd_split_combine.cu).
void combine_kv_split(const FwdParams& p, const KvSplit& split);

}  // namespace fusedattn::cuda::sm80
