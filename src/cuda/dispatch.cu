// The dispatch table, built from instance_table.inc (written by CMake from the options): one
// line per compiled instance. Choosing is a scan of a few dozen entries, negligible per call.
#include "cuda/dispatch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "cuda/common/kinds.h"
#include "cuda/sm90/fwd_split.h"
#include "fusedattn/error.h"

namespace fusedattn::cuda {

// Each architecture's launchers; explicit instantiations live in src/cuda/instances/.
namespace sm80 {
template <typename Element, int kHeadDim, MaskKind kMask> void run_fwd(const FwdParams&);
template <typename Element, int kHeadDim, MaskKind kMask> void run_bwd(const BwdParams&);
}  // namespace sm80
namespace sm90 {
template <typename Element, int kHeadDim, MaskKind kMask> void run_fwd(const FwdParams&);
template <typename Element, int kHeadDim, MaskKind kMask> void run_bwd(const BwdParams&);
}  // namespace sm90

namespace {

struct Entry {
  int arch;  // 80 or 90
  bool backward;
  DType dtype;
  int head_dim;
  MaskKind mask;
  FwdFn fwd;
  BwdFn bwd;
};

#define FUSEDATTN_ELEM_fp16 __half
#define FUSEDATTN_ELEM_bf16 __nv_bfloat16
#define FUSEDATTN_DTYPE_fp16 DType::kFloat16
#define FUSEDATTN_DTYPE_bf16 DType::kBFloat16
#define FUSEDATTN_MASK_full MaskKind::kFull
#define FUSEDATTN_MASK_window MaskKind::kWindow
#define FUSEDATTN_MASK_column MaskKind::kColumn
#define FUSEDATTN_ARCH_sm80 80
#define FUSEDATTN_ARCH_sm90 90
#define FUSEDATTN_FN_fwd(arch, dt, hd, mask) \
  &arch::run_fwd<FUSEDATTN_ELEM_##dt, hd, FUSEDATTN_MASK_##mask>, nullptr
#define FUSEDATTN_FN_bwd(arch, dt, hd, mask) \
  nullptr, &arch::run_bwd<FUSEDATTN_ELEM_##dt, hd, FUSEDATTN_MASK_##mask>
#define FUSEDATTN_IS_BWD_fwd false
#define FUSEDATTN_IS_BWD_bwd true
#define FUSEDATTN_INSTANCE(arch, dir, dt, hd, mask)                                             \
  Entry{FUSEDATTN_ARCH_##arch, FUSEDATTN_IS_BWD_##dir, FUSEDATTN_DTYPE_##dt, hd, FUSEDATTN_MASK_##mask, \
        FUSEDATTN_FN_##dir(arch, dt, hd, mask)},

const Entry kTable[] = {
#include "instance_table.inc"
};

MaskKind mask_of(const FwdParams& p) {
  if (p.column_mask != nullptr) return MaskKind::kColumn;
  return p.is_masked() ? MaskKind::kWindow : MaskKind::kFull;
}

// The smallest compiled head dim >= the request (head dims run on the next larger instance).
const Entry* find(int arch, bool backward, const FwdParams& p) {
  const Entry* best = nullptr;
  for (const Entry& e : kTable) {
    if (e.arch != arch || e.backward != backward || e.dtype != p.dtype || e.mask != mask_of(p)) continue;
    if (e.head_dim < p.head_dim) continue;
    if (!best || e.head_dim < best->head_dim) best = &e;
  }
  return best;
}

[[noreturn]] void no_instance(const FwdParams& p, const char* what) {
  throw Error(ErrorCode::kUnsupported, "head_dim",
              std::string("no compiled ") + what + " kernel for " + dtype_name(p.dtype) + " head_dim " +
                  std::to_string(p.head_dim) + "; this build has head dims " + compiled_head_dims() +
                  " (configure with -DFUSEDATTN_FULL=ON for all)");
}

// FUSEDATTN_DISABLE_SM90=1 forces the portable path (for A/B measurements and as an escape hatch).
bool sm90_allowed() {
  const char* env = std::getenv("FUSEDATTN_DISABLE_SM90");
  return !(env && env[0] == '1');
}

// What the Hopper kernels' TMA maps (over sm90::map_rows' rows) need: at least one query row and
// one key in use (non-empty extents) and int32 coordinates.
constexpr int64_t kMaxTmaCoordinate = INT32_MAX;
bool tma_maps_fit(const FwdParams& p) {
  const auto [rows_q, rows_k] = sm90::map_rows(p);
  return rows_q > 0 && rows_k > 0 && rows_q <= kMaxTmaCoordinate && rows_k <= kMaxTmaCoordinate;
}

// The Hopper forward kernel's limits; requests outside them use the portable path: its TMA maps'
// (tma_maps_fit), a variable-length batch's tiles countable in int32, and a positive scale (its
// online softmax takes the row max before scaling).
bool sm90_supports(const FwdParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows_q = sm90::map_rows(p).q;
  // The kernel counts a variable-length batch's tiles in int32 (64 rows is the smallest tile).
  constexpr int64_t kSmallestTileRows = 64;
  const bool countable = !varlen || (rows_q / kSmallestTileRows + p.batch + 1) * p.heads_q <= kMaxTmaCoordinate;
  // Paged K/V: FUSEDATTN_SM90_PAGED=0 sends it to the portable kernels (A/B measurements).
  const bool paged_allowed = p.block_table == nullptr || env_switch_or("FUSEDATTN_SM90_PAGED", true);
  return tma_maps_fit(p) && p.seqlen_k > 0 && countable && p.scale > 0.f && paged_allowed;
}

// seqused_k and paged K/V (loads_unwritten_rows): the Hopper kernel's TMA loads a sequence's last
// key block whole, rows past its keys too (a KV cache from torch.empty, or a page's unused rows,
// may hold NaN there, and P V's 0 * NaN would carry it), so warpgroup 0 zeroes those V rows
// before its P V turn (Consumer::clear_unused_v_rows). That needs every warpgroup to read every
// block, in GEMM turns: the 128 x 128 tiles (instances up to d128; d64 launches with seqused_k or
// pages take that tile, fwd_split.h's d64_tile) under any mask and the d192/d256 tiles under full
// masks. Masked launches on the d192/d256 instances (their slices skip blocks) take the portable
// path, whose loads zero-fill those rows. What counts is the instance's head dim: a build without
// the smaller instances (FUSEDATTN_HEAD_DIMS) runs a d64 call on d256's tile.
bool sm90_clears_unused_rows(const FwdParams& p, int instance_head_dim) {
  constexpr int kSquareTileMaxHeadDim = 128;
  return !loads_unwritten_rows(p) || instance_head_dim <= kSquareTileMaxHeadDim || !p.is_masked();
}

// Column masks have Hopper instances at some head dims only (tools/gen_instances.py: d64, d128):
// a column-masked call takes one where it is the instance the portable kernels would run too, and
// the other head dims stay portable rather than run on a larger Hopper tile. Column masks come
// only with dense calls (the API rejects varlen ones), so no paged K/V or seqused_k reaches here.
bool sm90_runs_head_dim(const FwdParams& p, const Entry& sm90, const Entry* portable) {
  if (mask_of(p) != MaskKind::kColumn) return true;
  return portable == nullptr || portable->head_dim == sm90.head_dim;
}

// The Hopper backward's limits (sm90/bwd_kernel.cuh); the rest runs the portable backward:
// calls without rows in use or beyond int32 TMA coordinates and column masks (no Hopper
// instance). Deterministic calls run on it too: its writer warp adds dQ in ordered turns. A head
// dim runs on a Hopper tile (d64, d128, d256) only where that is the instance the portable
// kernels would run too, not padded onto a larger one.
// FUSEDATTN_SM90_BWD=0 sends every backward to the portable kernels (A/B measurements).
bool sm90_backward_allowed(const BwdParams& p) {
  return tma_maps_fit(p) && p.column_mask == nullptr && env_switch_or("FUSEDATTN_SM90_BWD", true);
}

}  // namespace

FwdChoice choose_forward(const FwdParams& p, int cc_major, int cc_minor) {
  if (cc_major < 8)
    throw Error(ErrorCode::kUnsupported, "device",
                "the CUDA backend needs compute capability 8.0 or newer, got " + std::to_string(cc_major) + "." +
                    std::to_string(cc_minor));
  const Entry* portable = find(80, false, p);
  if (cc_major == 9 && cc_minor == 0 && sm90_allowed() && sm90_supports(p))
    if (const Entry* e = find(90, false, p);
        e && sm90_runs_head_dim(p, *e, portable) && sm90_clears_unused_rows(p, e->head_dim))
      return {e->fwd, "sm90", e->head_dim};
  if (const Entry* e = portable) return {e->fwd, "sm80", e->head_dim};
  no_instance(p, "forward");
}

BwdChoice choose_backward(const BwdParams& p, int cc_major, int cc_minor) {
  if (cc_major < 8)
    throw Error(ErrorCode::kUnsupported, "device",
                "the CUDA backend needs compute capability 8.0 or newer, got " + std::to_string(cc_major) + "." +
                    std::to_string(cc_minor));
  const Entry* portable = find(80, true, p);
  if (cc_major == 9 && cc_minor == 0 && sm90_allowed() && sm90_backward_allowed(p))
    if (const Entry* e = find(90, true, p);
        e && (portable == nullptr || portable->head_dim == e->head_dim))
      return {e->bwd, "sm90", e->head_dim};
  if (const Entry* e = portable) return {e->bwd, "sm80", e->head_dim};
  no_instance(p, "backward");
}

bool has_head_dim(int head_dim) {
  for (const Entry& e : kTable)
    if (e.head_dim >= head_dim && head_dim % 8 == 0) return true;
  return false;
}

std::string compiled_head_dims() {
  std::string s;
  int last = 0;
  for (int d = 8; d <= 256; d += 8)
    for (const Entry& e : kTable)
      if (e.head_dim == d && d != last) {
        s += (s.empty() ? "" : ", ") + std::to_string(d);
        last = d;
      }
  return s.empty() ? "none" : s;
}

}  // namespace fusedattn::cuda
