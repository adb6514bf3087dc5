// Column-sparse masks (Options::column_mask) on the Hopper forward kernel (MaskKind::kColumn,
// src/cuda/sm90/column_mask.cuh): that dispatch sends column-masked calls there, on the 128 x 128
// tile or (d64, FUSEDATTN_SM90_D64_TILE=pair) the 128 x 64 tile of two CTAs per SM, without GQA
// packing (the plan the launch makes), and not where it must not. The cases of
// tests/gpu/test_column_mask.cpp run on this kernel on Hopper (their default path, forward and
// backward); the ones here assert the plan before they run: packed causal documents as their
// variable-length batch, and a sliding window whose walk crosses the producer's 32-block scan
// chunks. Forward only, fp16 and bf16 by the 2x rule, fresh inputs, outputs poisoned before every
// run. Skips off Hopper.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/common/kinds.h"
#include "cuda/dispatch.h"
#include "cuda/sm90/fwd_split.h"
#include "gpu/gpu_check.h"
#include "gpu/scoped_env.h"
#include "gpu/sm90_plan.h"
#include "reference/column_mask.h"

namespace fusedattn::testing {
namespace {

// The head dims with a Hopper column instance (tools/gen_instances.py).
constexpr int kHopperColumnHeadDims[] = {64, 128};

// A tile the column kernel runs on: d64's are chosen by FUSEDATTN_SM90_D64_TILE (fwd_split.h,
// d64_tile), "128" or "pair"; the other head dims have the one.
struct ColumnTile {
  int head_dim;
  const char* d64_tile;
  int rows, keys, ctas_per_sm;
};
constexpr ColumnTile kSquareTile64{64, "128", 128, 128, 1}, kPairTile64{64, "pair", 128, 64, 2},
    kSquareTile128{128, "128", 128, 128, 1};
const ColumnTile kHopperColumnTiles[] = {kSquareTile64, kPairTile64, kSquareTile128};
void PrintTo(const ColumnTile& t, std::ostream* os) {
  *os << "d" << t.head_dim << " " << t.rows << " x " << t.keys << " (" << t.ctas_per_sm << " per SM)";
}

// Causal documents of varied lengths: one row, rows fewer than a block, a block's worth, and
// documents that cross several blocks, so query tiles meet keys of one, two or many documents.
const std::vector<int64_t> kDocuments = {300, 1, 129, 64, 450, 7};

// The params dispatch sees for `call` with mask m (its values are not read).
FwdParams column_params(const Problem& call, DType dtype, const Columns& m) {
  static const int32_t kAnyBounds[4] = {};
  FwdParams p = planning_params(call, dtype);
  p.column_mask = kAnyBounds;
  p.column_mask_intervals = static_cast<int>(m.intervals);
  p.column_mask_per_head = m.heads == call.heads_q && call.heads_q > 1;
  return p;
}

// Whether dispatch runs `call` with mask m on the Hopper column kernel, on `tile` unpacked; "" if
// so, else why not (a build without the instance says so: the test then skips).
std::string hopper_plan_problem(const Problem& call, DType dtype, const Columns& m, const ColumnTile& tile) {
  const FwdParams p = column_params(call, dtype, m);
  const cuda::FwdChoice choice = cuda::choose_forward(p, 9, 0);
  if (std::string(choice.arch) != "sm90") return std::string("dispatch chose ") + choice.arch;
  const cuda::sm90::FwdWork work = cuda::sm90::planned_fwd_work(p, cuda::MaskKind::kColumn, choice.instance_head_dim,
                                                                sm_count());
  if (work.shape.block_m != tile.rows || work.shape.block_n != tile.keys || work.shape.ctas_per_sm != tile.ctas_per_sm)
    return "tile " + std::to_string(work.shape.block_m) + " x " + std::to_string(work.shape.block_n) + ", " +
           std::to_string(work.shape.ctas_per_sm) + " per SM";
  if (work.rows.packing.shift != 0) return "GQA packed";
  if (work.split.shares != 0) return "tail split";
  if (work.shape.cluster_ctas != 1) return "CTA pairs";
  return "";
}

// Forward only: out and lse of c (run with a column mask) against the reference of `truth` by the
// 2x rule; hidden rows exactly out 0 and lse -inf.
void expect_forward_results(const HostCase& c, const Problem& truth, HiddenRows hidden) {
  Tensors ref, plain;
  masked_forward_references(c, truth, hidden, ref, plain);
  expect_masked_forward(c, ref, plain, hidden, atol_for(c.dtype), kLseAtol,
                        c.problem.str() + " " + dtype_name(c.dtype) + " on the Hopper kernel");
}

// Runs mc.call's forward with mask m (after asserting it takes the Hopper kernel on `tile`) and
// checks it.
SkipReason check_on_hopper(const MaskedCall& mc, Columns& m, DType dtype, const ColumnTile& tile) {
  SCOPED_TRACE(mc.call.str() + " " + dtype_name(dtype) + " against " + mc.truth.str() + ", d64 tile " + tile.d64_tile);
  const ScopedEnv forced("FUSEDATTN_SM90_D64_TILE", tile.d64_tile);
  if (const char* off = std::getenv("FUSEDATTN_DISABLE_SM90"); off != nullptr && off[0] == '1')
    return std::string("FUSEDATTN_DISABLE_SM90=1: the Hopper kernel is off");
  // A build without a Hopper instance for the call's head dim (FUSEDATTN_SM90=OFF, or head dims
  // left out) runs nothing here; with one, the column-masked call must take it.
  try {
    if (std::string(cuda::choose_forward(planning_params(mc.call, dtype), 9, 0).arch) != "sm90")
      return "no sm90 instance in this build for " + mc.call.str();
    if (!has_own_sm90_instance(mc.call, dtype))  // runs padded on a larger instance, not on `tile`
      return "no sm90 instance of the call's own head dim in this build for " + mc.call.str();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  const std::string off_hopper = hopper_plan_problem(mc.call, dtype, m, tile);
  if (!off_hopper.empty()) {
    ADD_FAILURE() << "not on the Hopper column kernel: " << off_hopper;
    return std::nullopt;
  }
  std::mt19937_64 rng = fresh_rng();
  HostCase c = make_case(mc.call, dtype, Layout::kBSHD, rng, kDefaultStddev, /*with_backward=*/false);
  DeviceCase dc(c);
  const DeviceTensor mask(m.bounds);
  ForwardArgs f = dc.forward_args();
  f.options.column_mask = mask.view(m.bounds);
  if (SkipReason skip = dc.forward(f)) return skip;
  expect_forward_results(c, mc.truth, mc.hidden);
  return std::nullopt;
}

class GpuSm90ColumnMask : public ::testing::TestWithParam<ColumnTile> {};

// GQA (4 query heads on 2 KV heads: unpacked all the same), both dtypes.
TEST_P(GpuSm90ColumnMask, PackedCausalDocumentsMatchTheirVarlenBatch) {
  SKIP_UNLESS_HOPPER();
  for (const DType dtype : kGpuDtypes) {
    Columns m(1, 1, total_length(kDocuments), 1);
    FUSEDATTN_RUN_OR_SKIP(
        check_on_hopper(packed_documents(kDocuments, 4, 2, GetParam().head_dim, m), m, dtype, GetParam()));
  }
}

// A sliding window of 100 keys written as columns over 4500 keys of an unmasked call: the
// window's range is every block, so a tile near the top walks down through a whole chunk of 32
// hidden blocks (and part of another) before it reaches the blocks it sees, and its last chunk
// reaches below block 0 (lanes past the range read nothing).
TEST_P(GpuSm90ColumnMask, SlidingWindowAcrossScanChunks) {
  SKIP_UNLESS_HOPPER();
  const int64_t s = 4500;
  const Problem call = dense(1, 2, 1, s, s, GetParam().head_dim);
  Columns m(1, 1, s, 2);
  hide_outside_window(m, 0, 0, s, s, 100, 0);
  const DType dtype = GetParam().head_dim == kHopperColumnHeadDims[0] ? DType::kFloat16 : DType::kBFloat16;
  FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, with_mask(call, false, 100, 0), {}}, m, dtype, GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Tiles, GpuSm90ColumnMask, ::testing::ValuesIn(kHopperColumnTiles),
                         [](const ::testing::TestParamInfo<ColumnTile>& info) {
                           return "d" + std::to_string(info.param.head_dim) + "_" +
                                  std::to_string(info.param.rows) + "x" + std::to_string(info.param.keys);
                         });

// FUSEDATTN_DISABLE_SM90=1 still sends column-masked calls to the portable kernels, and head dims
// without a Hopper column instance of their own stay there (a host-side plan; no kernel runs).
TEST(GpuSm90ColumnMaskPlan, SwitchAndOtherHeadDimsStayPortable) {
  SKIP_UNLESS_HOPPER();
  Columns m(1, 1, 300, 1);
  const Problem call = with_mask(dense(1, 2, 2, 300, 300, 128), true, -1, -1);
  {
    const ScopedEnv off("FUSEDATTN_DISABLE_SM90", "1");
    try {
      EXPECT_STREQ(cuda::choose_forward(column_params(call, DType::kFloat16, m), 9, 0).arch, "sm80");
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
  }
  for (const int d : {32, 96, 192, 256}) {
    try {
      const FwdParams params = column_params(dense(1, 2, 2, 300, 300, d), DType::kFloat16, m);
      const cuda::FwdChoice choice = cuda::choose_forward(params, 9, 0);
      if (std::string(choice.arch) == "sm90") {
        bool hopper_instance = false;
        for (const int h : kHopperColumnHeadDims) hopper_instance = hopper_instance || choice.instance_head_dim == h;
        EXPECT_TRUE(hopper_instance) << "d" << d << " on sm90 d" << choice.instance_head_dim;
      }
    } catch (const Error&) {
      // No instance at all for d in this build.
    }
  }
}

// The small case compute-sanitizer runs (its filter GpuSanitizer.* picks this up): packed causal
// documents, and a window written as columns on top of causal, on every column tile (ragged last
// tiles, both K rings wrapping); fp16.
TEST(GpuSanitizer, Sm90ColumnMaskSmallDocuments) {
  SKIP_UNLESS_HOPPER();
  for (const ColumnTile& tile : kHopperColumnTiles) {
    const int d = tile.head_dim;
    const std::vector<int64_t> docs = {130, 1, 300, 40, 70};
    Columns m(1, 1, total_length(docs), 1);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper(packed_documents(docs, 2, 1, d, m), m, DType::kFloat16, tile));
    const int64_t s = 333;
    Columns w(1, 1, s, 2);
    hide_outside_window(w, 0, 0, s, s, 50, -1);
    const Problem call = with_mask(dense(1, 2, 2, s, s, d), true, -1, -1);
    FUSEDATTN_RUN_OR_SKIP(check_on_hopper({call, with_mask(call, false, 50, 0), {}}, w, DType::kFloat16, tile));
  }
}

}  // namespace
}  // namespace fusedattn::testing
