// What the Hopper forward plans for a problem, asked through the host functions its launch uses
// (cuda/sm90/fwd_split.h), so a test can assert that a shape it means to split, pack or run on a
// given tile really does rather than pass on another path.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "cuda/dispatch.h"
#include "cuda/sm90/fwd_split.h"
#include "fusedattn/params.h"
#include "gpu/gpu_util.h"
#include "gpu/missing_instance.h"
#include "reference/problems.h"

namespace fusedattn::testing {

// The params dispatch and the Hopper launch see of pr, built as the API builds them: causal as
// window_right = 0 and the window folded (fold_unbounded_window); a varlen problem as its maxima,
// its packed rows and offsets whose values the plan does not read; page_size > 0: its keys paged
// (a table the plan does not read).
inline FwdParams planning_params(const Problem& pr, DType dtype, int64_t page_size = 0) {
  static const int32_t kOffsets[2] = {0, 0};
  FwdParams p;
  set_shape(p, pr);
  if (pr.varlen()) {
    p.seqlen_q = pr.max_seqlen_q();
    p.seqlen_k = pr.max_seqlen_k();
    p.cu_seqlens_q = p.cu_seqlens_k = kOffsets;
    p.varlen_rows_q = pr.total_q();
    p.varlen_rows_k = pr.cu_seqlens_k().back();
  }
  p.dtype = dtype;
  p.scale = pr.scale();
  p.window_left = pr.window_left;
  p.window_right = pr.causal ? 0 : pr.window_right;
  fold_unbounded_window(p);
  if (page_size > 0) {
    p.block_table = kOffsets;
    p.page_size = page_size;
    p.num_pages = 1;
  }
  return p;
}

// The work list (its tile shape, GQA packing and split) the Hopper launch plans for pr; nullopt
// where dispatch does not send pr to the Hopper forward: this build has no Hopper instance for it,
// or dispatch picks the portable forward (a test that means to run the Hopper kernel tells the two
// apart with sm90_forward_missing or expect_sm90_work, below).
inline std::optional<cuda::sm90::FwdWork> planned_sm90_work(const Problem& pr, DType dtype, int64_t page_size = 0) {
  const FwdParams p = planning_params(pr, dtype, page_size);
  try {
    const cuda::FwdChoice choice = cuda::choose_forward(p, 9, 0);
    if (std::string(choice.arch) != "sm90") return std::nullopt;
    const cuda::MaskKind mask = p.is_masked() ? cuda::MaskKind::kWindow : cuda::MaskKind::kFull;
    return cuda::sm90::planned_fwd_work(p, mask, choice.instance_head_dim, sm_count());
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The arch dispatch picks for pr's forward on an sm_90 device ("sm90" or "sm80"), under the
// switches set now; "" where no compiled instance covers it.
inline std::string planned_forward_arch(const Problem& pr, DType dtype, int64_t page_size = 0) {
  try {
    return cuda::choose_forward(planning_params(pr, dtype, page_size), 9, 0).arch;
  } catch (const Error&) {
    return "";
  }
}

// For a case meant to run on the Hopper forward that dispatch does not send there (a
// planned_sm90_work of nullopt): a skip reason where a plain dense problem of the same head dim and
// dtype does not reach the Hopper forward either (a build without that Hopper instance, with
// FUSEDATTN_SM90=OFF, or a run with FUSEDATTN_DISABLE_SM90=1); otherwise dispatch moved the case
// off the kernel its test exercises: a failure naming it is recorded here and the result is
// nullopt, so the caller drops the case (and the test fails).
inline SkipReason sm90_forward_missing(const Problem& pr, DType dtype, int64_t page_size = 0) {
  const Problem probe = dense(1, 1, 1, 64, 64, pr.head_dim);
  if (planned_forward_arch(probe, dtype) != "sm90")
    return "this build has no Hopper forward instance for " + std::string(dtype_name(dtype)) + " head_dim " +
           std::to_string(pr.head_dim);
  const std::string arch = planned_forward_arch(pr, dtype, page_size);
  if (arch == "sm90") {  // planned_fwd_work threw
    ADD_FAILURE() << pr.str() << " " << dtype_name(dtype) << ": the Hopper forward's plan failed";
  } else {
    ADD_FAILURE() << pr.str() << " " << dtype_name(dtype) << (page_size > 0 ? " paged" : "") << " dispatches to "
                  << (arch.empty() ? "no kernel" : arch) << ", not to the Hopper forward";
  }
  return std::nullopt;
}

// planned_sm90_work for a case that must run on the Hopper forward: its plan where dispatch sends
// it there. Otherwise nullopt, and the case is dropped: where this build has no Hopper forward for
// its head dim and dtype, with the reason kept in `skipped` (the first one a test meets), so that a
// test runs every case the build has and then skips (FUSEDATTN_RUN_OR_SKIP(skipped) at its end);
// else after a recorded failure (sm90_forward_missing).
inline std::optional<cuda::sm90::FwdWork> expect_sm90_work(const Problem& pr, DType dtype, SkipReason& skipped,
                                                            int64_t page_size = 0) {
  std::optional<cuda::sm90::FwdWork> work = planned_sm90_work(pr, dtype, page_size);
  if (work) return work;
  SkipReason why = sm90_forward_missing(pr, dtype, page_size);
  if (why && !skipped) skipped = std::move(why);
  return std::nullopt;
}

// Whether this build has a Hopper instance of pr's own head dim, not only a larger one that runs
// it padded (a build of other head dims, e.g. tools/gpu_check.sh with GPU_HEAD_DIMS="128;256" runs
// d64 calls on the d128 instance, whose tiles are not d64's).
inline bool has_own_sm90_instance(const Problem& pr, DType dtype) {
  try {
    const cuda::FwdChoice choice = cuda::choose_forward(planning_params(pr, dtype), 9, 0);
    return std::string(choice.arch) == "sm90" && choice.instance_head_dim == pr.head_dim;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace fusedattn::testing
