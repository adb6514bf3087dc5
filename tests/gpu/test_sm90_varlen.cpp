// Variable-length (cu_seqlens) batches on the Hopper forward kernel, through the public API: the
// dispatch choice, every mask shape and tile shape against the float64 reference under the 2x
// rule (sequences empty, shorter than a tile, ending inside a warpgroup's slice, longer than
// many tiles), the schedule switches, and rows past the last sequence (a packed tensor may be
// longer than cu_seqlens says) that hold NaN and must be neither read nor written. Outputs are
// poisoned before every run; inputs are fresh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/dispatch.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"

namespace fusedattn::testing {
namespace {

// A varlen parameter block as validation fills it (the pointers only need to be non-null).
FwdParams varlen_params(int head_dim, int64_t rows_q, int64_t rows_k) {
  static const int32_t kOffsets[2] = {0, 0};
  FwdParams p;
  p.dtype = DType::kFloat16;
  p.batch = 1;
  p.heads_q = p.heads_kv = 2;
  p.head_dim = head_dim;
  p.seqlen_q = rows_q;
  p.seqlen_k = rows_k;
  p.cu_seqlens_q = p.cu_seqlens_k = kOffsets;
  p.varlen_rows_q = rows_q;
  p.varlen_rows_k = rows_k;
  p.scale = 0.125f;
  return p;
}

std::string arch_for(const FwdParams& p) {
  try {
    return cuda::choose_forward(p, 9, 0).arch;
  } catch (const Error&) {
    return "none";  // no instance for the head dim in this build
  }
}

// Host-only: needs no GPU. Varlen goes to the Hopper kernel wherever the dense problem would
// (a build with that instance), unless its rows leave int32 or no sequence has a query or a key.
TEST(Sm90VarlenDispatch, PicksHopperWithinItsLimits) {
  for (int d : {64, 128, 256}) {
    FwdParams dense = varlen_params(d, 1000, 900);
    dense.cu_seqlens_q = dense.cu_seqlens_k = nullptr;
    if (arch_for(dense) != "sm90") continue;
    // The Hopper instance the call runs on: d256's where a build has no smaller one.
    const int instance_head_dim = cuda::choose_forward(dense, 9, 0).instance_head_dim;
    EXPECT_EQ(arch_for(varlen_params(d, 1000, 900)), "sm90") << "d" << d;
    EXPECT_EQ(arch_for(varlen_params(d, 1000, 0)), "sm80") << "no keys at all, d" << d;
    EXPECT_EQ(arch_for(varlen_params(d, 0, 900)), "sm80") << "no query rows at all, d" << d;
    EXPECT_EQ(arch_for(varlen_params(d, int64_t{1} << 31, 900)), "sm80") << "rows past int32, d" << d;
    // seqused_k: the Hopper kernel clears a sequence's unused rows where every warpgroup reads
    // every block (dispatch.cu, sm90_clears_unused_rows), on the instances up to d128.
    static const int32_t kUsed[1] = {500};
    FwdParams used = varlen_params(d, 1000, 900);
    used.seqused_k = kUsed;
    EXPECT_EQ(arch_for(used), "sm90") << "seqused_k, d" << d;
    used.window_right = 0;  // causal
    EXPECT_EQ(arch_for(used), instance_head_dim <= 128 ? "sm90" : "sm80") << "seqused_k, causal, d" << d;
  }
}

class Sm90Varlen : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_UNLESS_HOPPER(); }
};

// Lengths around the tile edges: 0, 1, under one warpgroup slice (64), one slice plus a row,
// a tile (128) and 192-row tiles plus and minus a row, several tiles.
const std::vector<int64_t> kLensQ = {5, 0, 130, 260, 64, 193, 1, 127};
const std::vector<int64_t> kLensK = {7, 9, 0, 200, 65, 191, 300, 128};

TEST_F(Sm90Varlen, EveryMaskMatchesReference) {
  for (int d : {64, 128, 256}) {
    SCOPED_TRACE("d" + std::to_string(d));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(packed(4, 2, d, kLensQ, kLensK)));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(4, 2, d, kLensQ, kLensK), true, -1, -1)));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(3, 1, d, kLensQ, kLensK), false, 31, 5)));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(2, 2, d, {200, 17}, {180, 40}), false, 0, 0)));
  }
}

// seqused_k: each sequence attends to the first keys of its rows (clamped to [0, rows]), and
// a decode step over padded caches: one query per sequence, few tiles over long rows, which the
// tail split cuts into shares of each tile's own blocks. The rows past each sequence's used keys
// hold NaN (a KV cache from torch.empty): none may reach the output. (Masked d256 takes the
// portable kernels; dispatch.cu, sm90_clears_unused_rows.)
void check_nan_past_used_keys(const Problem& p, DType dtype) {
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(p, dtype, Layout::kBSHD, rng);
  const std::vector<int32_t> cu = p.cu_seqlens_k();
  const int64_t row_elems = int64_t{p.heads_kv} * p.head_dim;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t used = std::clamp<int64_t>(p.seqused_k[b], 0, p.lens_k[b]);
    for (int64_t e = (cu[b] + used) * row_elems; e < int64_t{cu[b + 1]} * row_elems; ++e)
      c.values.k[e] = c.values.v[e] = std::numeric_limits<double>::quiet_NaN();
  }
  refill_inputs(c);
  FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(c));
}

TEST_F(Sm90Varlen, SequsedKLimitsEachSequencesKeys) {
  const std::vector<int64_t> used = {3, 9, 5, 150, -2, 500, 299, 64};
  for (int d : {64, 128, 256}) {
    SCOPED_TRACE("d" + std::to_string(d));
    Problem p = packed(4, 2, d, kLensQ, kLensK);
    p.seqused_k = used;
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(p));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(p, true, -1, -1)));
    FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(p, false, 31, 5)));
  }
  Problem decode = packed(32, 8, 128, {1, 1, 1, 1, 1}, {4096, 4096, 4096, 4096, 3000});
  decode.seqused_k = {4000, 1, 2500, 0, 3000};
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(decode));
  FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(decode, true, -1, -1)));
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    check_nan_past_used_keys(decode, dtype);
    for (int d : {64, 128, 256}) {
      Problem p = packed(4, 2, d, kLensQ, kLensK);
      p.seqused_k = used;
      check_nan_past_used_keys(p, dtype);
      check_nan_past_used_keys(with_mask(p, true, -1, -1), dtype);
    }
  }
  // d64 lengths that would take the 192-row tile (full) or the pair tile (causal), forced too:
  // seqused_k launches take the 128-row tile whatever (fwd_split.h's d64_tile).
  Problem long_q = packed(4, 2, 64, {600, 3, 700}, {700, 900, 1000});
  long_q.seqused_k = {650, 2, 999};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    check_nan_past_used_keys(long_q, dtype);
    check_nan_past_used_keys(with_mask(long_q, true, -1, -1), dtype);
  }
  for (const char* forced : {"pair", "192"}) {
    const ScopedEnv tile("FUSEDATTN_SM90_D64_TILE", forced);
    check_nan_past_used_keys(with_mask(long_q, true, -1, -1), DType::kFloat16);
  }
}

// Long sequences among short ones: many tiles per sequence, the d64 192-row tile (max_seqlen_q >=
// 512 for full masks, >= 2048 for masked ones) and a batch whose tiles outnumber the SMs.
TEST_F(Sm90Varlen, LongAndShortSequencesTogether) {
  const std::vector<int64_t> lens_q = {2100, 3, 700, 0, 1500, 64}, lens_k = {1800, 2500, 700, 40, 1500, 1};
  for (int d : {64, 128}) {
    SCOPED_TRACE("d" + std::to_string(d));
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(packed(4, 4, d, lens_q, lens_k), DType::kFloat16));
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(with_mask(packed(4, 2, d, lens_q, lens_k), true, -1, -1), DType::kBFloat16));
  }
}

// The schedule and pipeline switches change how tiles are handed out and when Q buffers return;
// each must still cover every tile once.
TEST_F(Sm90Varlen, ScheduleSwitches) {
  const std::vector<std::pair<const char*, const char*>> switches = {
      {"FUSEDATTN_SM90_DYNAMIC", "0"}, {"FUSEDATTN_SM90_PERSISTENT", "0"}, {"FUSEDATTN_SM90_Q_PREFETCH", "0"},
      {"FUSEDATTN_SM90_D64_TILE", "192"}, {"FUSEDATTN_SM90_PINGPONG", "0"}};
  for (const auto& [name, value] : switches) {
    SCOPED_TRACE(std::string(name) + "=" + value);
    const ScopedEnv env(name, value);
    for (int d : {64, 128}) {
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(with_mask(packed(2, 1, d, kLensQ, kLensK), true, -1, -1), DType::kFloat16));
      FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(packed(2, 2, d, kLensQ, kLensK), DType::kFloat16));
    }
  }
}

// GQA packing of variable-length batches (sm90/fwd_split.h: tiled_rows): a tile holds a KV head's
// group of query heads, position-major, so a sequence has its positions times the group in tiled
// rows, and a slice that crosses its sequence's end is stored row by row to (query head,
// position). Groups 2 to 8, decode-like and mixed lengths (empty sequences, ends inside a slice),
// every mask kind, by default (where the plan packs) and forced on and off.
TEST_F(Sm90Varlen, PackedGqaGroups) {
  const std::vector<int64_t> decode_q = {1, 1, 0, 1, 1}, decode_k = {300, 1, 20, 4000, 129};
  const std::vector<int64_t> draft_q = {3, 40, 17, 9}, draft_k = {500, 64, 900, 9};
  for (const char* pack : {"default", "1", "0"}) {
    SCOPED_TRACE(std::string("FUSEDATTN_SM90_PACK_GQA=") + pack);
    std::optional<ScopedEnv> env;
    if (std::string(pack) != "default") env.emplace("FUSEDATTN_SM90_PACK_GQA", pack);
    for (int d : {64, 128, 256}) {
      SCOPED_TRACE("d" + std::to_string(d));
      FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(packed(8, 2, d, decode_q, decode_k)));
      FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(16, 2, d, draft_q, draft_k), true, -1, -1)));
      FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(8, 1, d, kLensQ, kLensK), true, -1, -1)));
      FUSEDATTN_RUN_OR_SKIP(forward_all_dtypes(with_mask(packed(4, 2, d, kLensQ, kLensK), false, 31, 5)));
    }
  }
}

// Calls in a row on one stream, varlen and dense in turn: the dynamic schedule's counter, which
// a varlen launch cannot reset itself, is zero again for the next launch (a dense launch of more
// tiles than SMs skipped tiles when it was not).
TEST_F(Sm90Varlen, RepeatedCallsOnOneStream) {
  for (int i = 0; i < 3; ++i) {
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(with_mask(packed(4, 2, 128, kLensQ, kLensK), true, -1, -1), DType::kFloat16));
    FUSEDATTN_RUN_OR_SKIP(check_forward_gpu(dense(1, 2 * sm_count(), 2, 300, 64, 64), DType::kFloat16));
  }
}

// The packed tensors are longer than cu_seqlens says: a last "sequence" of NaN rows that
// cu_seqlens leaves out. The kept sequences match the reference computed without those rows
// (NaN read as a key or value would reach them) and the rows past them stay poisoned.
TEST_F(Sm90Varlen, RowsPastTheLastSequenceAreNeverTouched) {
  const std::vector<int64_t> lens_q = {70, 129, 5}, lens_k = {60, 130, 77};
  constexpr int64_t kExtraQ = 100, kExtraK = 90;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d" + std::to_string(d) + (causal ? " causal" : " full"));
      const Problem kept = with_mask(packed(2, 1, d, lens_q, lens_k), causal, -1, -1);
      std::vector<int64_t> long_q = lens_q, long_k = lens_k;
      long_q.push_back(kExtraQ);
      long_k.push_back(kExtraK);
      std::mt19937_64 rng = fresh_rng();
      HostCase c = make_case(with_mask(packed(2, 1, d, long_q, long_k), causal, -1, -1), DType::kFloat16,
                             Layout::kBSHD, rng);
      const int64_t row_q = kept.total_q() * 2 * d, row_k = kept.total_k() * 1 * d;  // canonical [total, H, D]
      for (int64_t i = row_q; i < static_cast<int64_t>(c.values.q.size()); ++i) c.values.q[i] = NAN;
      for (int64_t i = row_k; i < static_cast<int64_t>(c.values.k.size()); ++i) c.values.k[i] = c.values.v[i] = NAN;
      refill_inputs(c);
      DeviceCase dc(c);
      ForwardArgs a = dc.forward_args();
      a.options.cu_seqlens_q.shape[0] = a.options.cu_seqlens_k.shape[0] = kept.batch + 1;
      FUSEDATTN_RUN_OR_SKIP(dc.forward(a));

      Tensors ref, plain;
      ref.q.assign(c.values.q.begin(), c.values.q.begin() + row_q);
      ref.k.assign(c.values.k.begin(), c.values.k.begin() + row_k);
      ref.v.assign(c.values.v.begin(), c.values.v.begin() + row_k);
      plain = ref;
      reference_forward(kept, ref);
      plain_forward(kept, DType::kFloat16, plain);
      const std::vector<double> out = c.out.to_double(), lse = c.lse.to_double();
      EXPECT_TRUE(obeys_2x_rule(std::vector<double>(out.begin(), out.begin() + row_q), plain.out, ref.out,
                                atol_for(DType::kFloat16)));
      const int64_t total_q = c.problem.total_q();
      std::vector<double> kept_lse;
      for (int h = 0; h < 2; ++h)
        for (int64_t r = 0; r < total_q; ++r) {
          const double x = lse[h * total_q + r];
          if (r < kept.total_q()) kept_lse.push_back(x);
          else EXPECT_TRUE(std::isnan(x)) << "lse written past the last sequence, head " << h << " row " << r;
        }
      EXPECT_TRUE(obeys_2x_rule(kept_lse, plain.lse, ref.lse, kLseAtol));
      for (int64_t i = row_q; i < static_cast<int64_t>(out.size()); ++i)
        ASSERT_TRUE(std::isnan(out[i])) << "out written past the last sequence at element " << i;
    }
}

}  // namespace
}  // namespace fusedattn::testing
