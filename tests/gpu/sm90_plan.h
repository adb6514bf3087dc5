// What the Hopper forward plans for a problem, asked through the host functions its launch uses
// (cuda/sm90/fwd_split.h), so a test can assert that a shape it means to split, pack or run on a
// given tile really does rather than pass on another path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cuda/dispatch.h"
#include "cuda/sm90/fwd_split.h"
#include "fusedattn/params.h"
#include "gpu/gpu_util.h"
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
// when this build has no Hopper instance for it.
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
