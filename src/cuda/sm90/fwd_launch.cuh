// run_fwd for the Hopper forward kernel: builds the TMA descriptors, reads the ablation switches,
// sizes the grid (persistent: at most one CTA per SM) and launches. Explicit instances live in
// src/cuda/instances/sm90_fwd_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>

#include "cuda/common/captured_fork.h"
#include "cuda/common/check.cuh"
#include "cuda/common/column_scratch.h"
#include "cuda/common/device.h"
#include "cuda/common/env.h"
#include "cuda/common/kinds.h"
#include "cuda/common/schedule.h"
#include "cuda/sm90/fwd_split.h"
#include "cuda/sm90/kernel.cuh"
#include "cuda/sm90/split_workspace.h"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tile_counter.h"
#include "cuda/sm90/trace_sink.h"
#include "fusedattn/error.h"
#include "fusedattn/params.h"

namespace fusedattn::cuda::sm90 {

// The plan splits fewer than this many waves of tiles (tail_shares.h: the last wave, or that plus
// one): the workspace's ticket counters are laid out for that many tiles per SM.
constexpr int kMaxSplitWaves = 2;

// Defaults from the measurements in docs/hopper.md (H200): every optimisation on. The
// intra-warpgroup overlap needs the early K release (with K and V freed together, 2 stages leave
// the next K's load exposed and the overlap loses 13-21% at d128/d256); a persistent grid with
// the dynamic (atomic counter) schedule beats one CTA per tile on causal masks by up to 15%; on
// full masks the static round robin wins up to 4096 keys at d128/d256 (prefers_static_schedule).
// FUSEDATTN_SM90_STAGES=n, FUSEDATTN_SM90_PINGPONG=0|1, FUSEDATTN_SM90_OVERLAP=0|1,
// FUSEDATTN_SM90_PERSISTENT=0|1, FUSEDATTN_SM90_DYNAMIC=0|1 (0: static persistent for full
// masks, one CTA per tile for causal ones), FUSEDATTN_SM90_EARLY_K=0|1, FUSEDATTN_SM90_NARROW_FIRST=0|1 and
// FUSEDATTN_SM90_RESCALE_SLACK=x (log2 units the running max may lag behind; 0: the textbook
// online softmax) and FUSEDATTN_SM90_Q_PREFETCH=0|1 (the next tile's Q loaded into a second
// buffer while the current tile runs; d64/d128 only, d256 has room for one Q) override them for
// A/B measurements; FUSEDATTN_SM90_O_IN_KV=0|1 keeps d256's O staged in its one Q buffer (which
// the next tile's Q then waits for) or stages it in the last KV stage (default: up to
// kOInKVMaxKeys keys, kPairOInKVMaxKeys in CTA pairs); FUSEDATTN_SM90_DEFER_O_READ=0 waits in the epilogue for the store to leave
// that stage instead of behind the next tile's first Q K^T (Features::defer_o_read). FUSEDATTN_SM90_TAIL_SPLIT=0 runs every tile of a full-mask launch whole and
// FUSEDATTN_SM90_PACK_GQA=0|1 turns GQA packing off or on wherever the group allows (fwd_split.h).
// FUSEDATTN_SM90_O_ONE_BOX=0 stores each warpgroup's O slice as one box per slab where it would
// be one request (stores_o_as_one_box).
// FUSEDATTN_SM90_ONE_ROW=0 runs slices of at most 8 rows in use a warp through the two-row loop
// (KernelParams::one_row); FUSEDATTN_SM90_WARP_SPLIT=0 runs them through the one-row wgmma loop
// rather than with their keys split over the warps (KernelParams::warp_split).
// FUSEDATTN_SM90_SUM_CHECK=0 turns off the softmax step without the row max (Features::sum_limit),
// FUSEDATTN_SM90_REBASE=0 its rebase from the probabilities where it writes them over S
// (Consumer::kSumCheckInPlace; every failed check then computes the scores again).
constexpr bool kQPrefetchDefault = true;
// O staged in K/V (d256, KernelConfig::kStagesOInKV) by default up to this many keys: H200, one
// process, on / off in both column orders (docs/hopper.md, session 19): +5-10% at 512, +3-5% at
// 1k, +2-3% at 2k, even at 4k-8k, but 1-5% slower at full 16k, in every pairing.
constexpr int64_t kOInKVMaxKeys = 8192;
// The same for the CTA pairs (fwd_split.h, uses_pair_cluster). H200 fp16 d256 full, medians of
// five in one process, TFLOP/s unpaired / paired with O in K/V / paired with O in the Q buffer:
// 2k 678 / 676 / 656, 4k 695 / 698 / 695; 8k paired with O in K/V 710 and 712 (two columns), in
// the Q buffer 722 (docs/hopper.md, session 37).
constexpr int64_t kPairOInKVMaxKeys = 4096;
inline Features features_from_env(int compiled_stages, int compiled_v_stages, int compiled_q_buffers,
                                  bool persistent_default, bool dynamic_default, bool o_in_kv_default,
                                  bool pingpong_default) {
  Features f;
  f.pingpong = env_switch_or("FUSEDATTN_SM90_PINGPONG", pingpong_default);
  f.early_k_release = env_switch_or("FUSEDATTN_SM90_EARLY_K", true);
  f.narrow_first = env_switch_or("FUSEDATTN_SM90_NARROW_FIRST", true);
  // H200, one process, medians of 3-4 runs: d256 full 1k-8k +0.4-2.7% (docs/hopper.md, sessions
  // 24-25); the trace puts the epilogue ~900 cycles shorter.
  f.defer_o_read = env_switch_or("FUSEDATTN_SM90_DEFER_O_READ", true);
  f.overlap = env_switch_or("FUSEDATTN_SM90_OVERLAP", true);
  // The dynamic schedule is a persistent grid's: asking for it implies one unless PERSISTENT=0.
  f.dynamic = env_switch_or("FUSEDATTN_SM90_DYNAMIC", dynamic_default);
  f.persistent = env_switch_or("FUSEDATTN_SM90_PERSISTENT", f.dynamic || persistent_default);
  f.num_stages = compiled_stages;
  if (const char* v = std::getenv("FUSEDATTN_SM90_STAGES")) f.num_stages = std::clamp(std::atoi(v), 1, compiled_stages);
  // The overlapped loop holds one stage while it waits for the next: it needs two.
  if (f.overlap) f.num_stages = std::max(f.num_stages, 2);
  f.num_v_stages = compiled_v_stages > compiled_stages ? compiled_v_stages : f.num_stages;
  if (const char* v = std::getenv("FUSEDATTN_SM90_V_STAGES"); v && compiled_v_stages > compiled_stages)
    f.num_v_stages = std::clamp(std::atoi(v), f.num_stages, compiled_v_stages);
  if (const char* v = std::getenv("FUSEDATTN_SM90_RESCALE_SLACK")) {
    f.rescale_slack = std::clamp(static_cast<float>(std::atof(v)), 0.f, kMaxRescaleSlack);
  }
  f.q_buffers = env_switch_or("FUSEDATTN_SM90_Q_PREFETCH", kQPrefetchDefault) ? compiled_q_buffers : 1;
  // H200, one process, both column orders: d128 full 2k-16k +6-10%, causal 2k-8k +4-6%, full
  // 512 +5% (docs/hopper.md, session 22); d64's 192-row tile full 2k-16k +9-11%, d256 full +1-2%
  // (session 23).
  f.sum_limit = env_switch_or("FUSEDATTN_SM90_SUM_CHECK", true) ? std::exp2(f.rescale_slack) : 0.f;
  f.rebase_limit = env_switch_or("FUSEDATTN_SM90_REBASE", true) ? kRebaseLimit : 0.f;
  f.o_in_kv = f.overlap && env_switch_or("FUSEDATTN_SM90_O_IN_KV", o_in_kv_default);
  return f;
}

// Whether a launch on the caller's stream, behind the caller's kernel, goes out as a dependent
// launch (ClusterLaunch), which the driver may start before that kernel has completed. (An eager
// quad mix never does; a captured one's quads do: launch_quad_mix.) H200, a copy kernel then the
// forward, many in a row (tools/chain_bench.py): 0.3-1.3 us less a decode call; do_bench's calls
// alone read even (docs/hopper.md, session 92). FUSEDATTN_SM90_PDL=0 launches plainly.
constexpr bool kDependentLaunchDefault = true;
inline bool dependent_launch() { return env_switch_or("FUSEDATTN_SM90_PDL", kDependentLaunchDefault); }

// A launch of `grid` CTAs of `threads` in clusters of cluster_ctas along x (1: no cluster
// attribute), as a dependent launch where `dependent` (programmatic stream serialisation: the
// kernel may start while the kernel before it on the stream finishes; fwd_kernel waits for it
// before touching global memory). Not copyable: the configuration points at its attributes.
// `started`, where given, is recorded once every block has begun (the quad mix orders its pair
// launch behind it).
struct ClusterLaunch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute attrs[3]{};
  ClusterLaunch(int64_t grid, int threads, int smem_bytes, cudaStream_t stream, int cluster_ctas,
                bool dependent = false, cudaEvent_t started = nullptr) {
    config.gridDim = dim3(static_cast<unsigned>(grid));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    config.attrs = attrs;
    if (cluster_ctas > 1) {
      cudaLaunchAttribute& cluster = attrs[config.numAttrs++];
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(cluster_ctas);
      cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
    }
    if (dependent) {
      cudaLaunchAttribute& serialisation = attrs[config.numAttrs++];
      serialisation.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      serialisation.val.programmaticStreamSerializationAllowed = 1;
    }
    if (started != nullptr) {
      cudaLaunchAttribute& completion = attrs[config.numAttrs++];
      completion.id = cudaLaunchAttributeLaunchCompletionEvent;
      completion.val.launchCompletionEvent.event = started;
      completion.val.launchCompletionEvent.flags = 0;
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many clusters of kClusterCtas CTAs of kKernel the device runs at once, 0 where none fits
// (cached per kernel, cluster size and device: known[d] holds the count + 1 once asked, 0
// before). The kernel is a template argument so that each kernel has a cache of its own: as a
// function argument its type, the same for every instance, would have made one cache serve all
// of them.
template <auto kKernel, int kClusterCtas>
int max_active_clusters(int threads, int smem_bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kMaxDevices && known[device].load() > 0) return known[device].load() - 1;
  const ClusterLaunch one(kClusterCtas, threads, smem_bytes, nullptr, kClusterCtas);
  int clusters = 0;
  // A failed query (a cluster the GPU or its partition cannot schedule) counts as none fitting;
  // the error (not a sticky one) is cleared so that no later check reports it.
  if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &one.config) != cudaSuccess) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  clusters = std::max(clusters, 0);
  if (device < kMaxDevices) known[device].store(clusters + 1);
  return clusters;
}

// A share of a clustered launch's work list, where two launches split it (launch_quad_mix): the
// items [begin, end), on at most `clusters` clusters at once, on `stream`, every item whole; a
// dependent launch or not, and the event to record once all its blocks have begun (none: nullptr).
struct ClusterSlice {
  int64_t begin, end, clusters;
  cudaStream_t stream;
  bool dependent;
  cudaEvent_t started;
};

// Sets kKernel's shared-memory attributes and returns how many of its CTAs (clusters of
// kClusterCtas where that is more than one) run at once; 0 where no cluster fits.
template <auto kKernel, int kClusterCtas>
int64_t launch_slots(int threads, int smem_bytes, int ctas_per_sm, int num_sms) {
  FUSEDATTN_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  // All of the SM's unified L1/shared memory as shared, so ctas_per_sm CTAs fit side by side.
  FUSEDATTN_CUDA_CHECK(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  // A cluster's CTAs run on SMs of one GPC, so where a GPC had an odd number of SMs one of them
  // would hold no pair: a clustered launch's slots are the clusters that fit at once (the H200
  // fits 66 pairs, all of its 132 SMs, and 30 quads).
  if constexpr (kClusterCtas > 1) return max_active_clusters<kKernel, kClusterCtas>(threads, smem_bytes);
  return int64_t{num_sms} * ctas_per_sm;
}

// Launches the forward of p on kShape's kernel. Returns false, having launched nothing, where
// kShape is clustered and this GPU fits none of its clusters (launch_fwd_maybe_paired then runs
// the unpaired kernel); true otherwise.
template <typename Element, int kHeadDim, MaskKind kMask, TileShape kShape>
bool launch_fwd(const FwdParams& p, const TiledRows& rows, int num_sms, const ClusterSlice* slice = nullptr) {
  using Cfg = KernelConfig<Element, kHeadDim, kShape>;
  constexpr int kSmemBytes = shared_bytes<Element, Cfg>();
  constexpr bool kClustered = Cfg::kClusterCtas > 1;
  const int num_m_blocks = static_cast<int>(rows.blocks(Cfg::kBlockM));
  constexpr auto kernel = fwd_kernel<Element, Cfg, kMask>;
  // Persistent or not, kCtasPerSm CTAs per SM run at a time (the shared memory and registers
  // allow no more): those are the plan's slots.
  int64_t slots = launch_slots<kernel, Cfg::kClusterCtas>(Cfg::kThreads, kSmemBytes, Cfg::kCtasPerSm, num_sms);
  if (slots == 0) return false;
  if (slice != nullptr) slots = std::min(slots, slice->clusters);
  FwdWork work = fwd_work(p, kMask, kHeadDim, rows, kShape, slots);
  const int64_t first_item = slice != nullptr ? slice->begin : 0;
  if (slice != nullptr) {
    if (!kClustered) throw Error(ErrorCode::kRuntime, "slice", "only clustered launches share a work list");
    work.split = TailShares::unsplit(static_cast<int>(slice->end), work.kv_blocks);
  }
  if (work.tiles == 0 || work.items() <= first_item) return true;

  KernelParams kp{};
  kp.p = p;
  kp.num_m_blocks = num_m_blocks;
  kp.item_offset = static_cast<int>(first_item);
  kp.packing = rows.packing;
  // Masked tiles differ in length: grouped longest-first order (equal tiles keep head-major
  // order, where the CTAs running together share one head's K/V). A pair's K and V: 2 seqlen_k
  // rows of head_dim elements. A variable-length batch groups the heads of each sequence (its
  // scan goes sequence by sequence), sized for the longest; short query heads take half a group
  // (schedule_group_divisor).
  const bool varlen = p.cu_seqlens_q != nullptr;
  kp.schedule_shift =
      kMask == MaskKind::kFull
          ? 0
          : schedule_shift(2 * p.seqlen_k * p.head_dim * static_cast<int64_t>(sizeof(Element)),
                           varlen ? rows.heads : rows.heads * p.batch,
                           kScheduleL2Share * schedule_group_divisor(kHeadDim, kShape, num_m_blocks));
  constexpr uint32_t kDescHigh = ptx::desc_high_word(ptx::kSwizzleAtomBytes);
  kp.desc_high = {kDescHigh, kDescHigh, kDescHigh};
  // Two CTAs per SM (kD64Pair) interleave their warpgroups' GEMMs without turns: H200, d64
  // causal 512 / 1k, TFLOP/s with / without the turns, two runs in one process: 277-279 /
  // 287-289, 342-345 / 346-350 (docs/hopper.md, session 20).
  kp.features = features_from_env(Cfg::kStages, Cfg::kVStages, Cfg::kQBuffers, kMask == MaskKind::kFull,
                                  !prefers_static_schedule(p, kMask, kHeadDim),
                                  p.seqlen_k <= (kClustered ? kPairOInKVMaxKeys : kOInKVMaxKeys),
                                  Cfg::kCtasPerSm == 1);
  // A tile whose registers leave no room for the overlapped loop does not compile it (consumer.cuh).
  if constexpr (!Consumer<Element, Cfg, kMask>::kOverlaps) kp.features.overlap = kp.features.o_in_kv = false;
  if (loads_unwritten_rows(p)) {
    // Warpgroup 0 zeroes the unused V rows of a sequence's last block before its P V turn, and
    // the GEMM turns order the others' after it (Consumer::clear_unused_v_rows): that needs the
    // turns, and every warpgroup reading every block. Dispatch sends nothing else here.
    using Mask = TileMask<kMask, Cfg::kBlockM, Cfg::kBlockN, Cfg::kClusterCtas>;
    if (Cfg::kCtasPerSm != 1 || Mask::kSlicesSkipBlocks)
      throw Error(ErrorCode::kRuntime, p.seqused_k != nullptr ? "seqused_k" : "block_table",
                  "this Hopper tile cannot clear a block's unused rows");
    kp.features.pingpong = true;
  }
  // A cluster's CTAs walk the same items in step: persistent; full masks' equal items statically,
  // masked ones by the counter, rank 0 handing each item on (tile_scheduler.cuh, Producer::next_tile).
  if constexpr (kClustered) {
    kp.features.persistent = true;
    if constexpr (kMask == MaskKind::kFull) kp.features.dynamic = false;
  }
  // A variable-length batch's tiles add their sequence's first row (map_rows).
  const auto [rows_q, rows_k] = map_rows(p);
  const int group = 1 << rows.packing.shift;
  kp.tma_q = make_grouped_tensor_map(operand_view(p, p.q, rows_q, p.heads_q, p.q_stride), group, Cfg::kSlabCols, Cfg::kQSlotRows);
  // In a cluster each CTA loads its share of a K/V block's rows (Producer::load_cluster_share).
  // Paged K/V: [pages, page rows, heads, dim], a block's box within one page (runs_block64), its
  // page from the table (Producer::kv_coordinates).
  const auto kv_view = [&](const void* base, const OperandStrides& s) {
    if (p.block_table == nullptr) return operand_view(p, base, rows_k, p.heads_kv, s);
    return OperandView{base, p.dtype, p.head_dim, p.page_size, p.heads_kv, p.num_pages, s};
  };
  if (p.block_table != nullptr && p.page_size % Cfg::kBlockN != 0)
    throw Error(ErrorCode::kRuntime, "block_table", "this Hopper tile's KV blocks would straddle pages");
  const L2Promotion kv_promotion = kv_l2_promotes_128b(rows) ? L2Promotion::k128B : L2Promotion::k256B;
  kp.tma_k = make_tensor_map(kv_view(p.k, p.k_stride), Cfg::kSlabCols, Cfg::kClusterBlockRows, kv_promotion);
  kp.tma_v = make_tensor_map(kv_view(p.v, p.v_stride), Cfg::kSlabCols, Cfg::kClusterBlockRows, kv_promotion);
  kp.one_row = env_switch_or("FUSEDATTN_SM90_ONE_ROW", true);
  kp.warp_split = env_switch_or("FUSEDATTN_SM90_WARP_SPLIT", true);
  kp.o_one_box = stores_o_as_one_box(p, Epilogue<Element, Cfg, kMask == MaskKind::kFull>::kOneBoxStaging,
                                     rows.packing.shift, Cfg::kTileCols);
  const OperandView o_view = operand_view(p, p.o, rows_q, p.heads_q, p.o_stride);
  kp.tma_o = kp.o_one_box ? make_slab_tensor_map(o_view, Cfg::kSlabs, Cfg::kSlabCols, kWarpgroupRows)
                          : make_grouped_tensor_map(o_view, group, Cfg::kSlabCols, kWarpgroupRows);

  const auto stream = slice != nullptr ? slice->stream : static_cast<cudaStream_t>(p.stream);
  if constexpr (kMask == MaskKind::kColumn) {
    // The column producer reads a tile head as a query head and K/V rows as a dense batch's
    // (column_producer.cuh); dispatch and tiled_rows keep the rest away.
    if (rows.packing.shift != 0 || loads_unwritten_rows(p) || varlen)
      throw Error(ErrorCode::kRuntime, "column_mask",
                  "the Hopper column-mask kernel runs dense calls without GQA packing only");
  }
  SplitWorkspace workspace;
  if (work.split.split()) {
    // A split pair's two query blocks take a slot each (TileScheduler::tile_at).
    workspace = split_workspace(stream, int64_t{kMaxSplitWaves} * num_sms * Cfg::kCtasPerSm,
                                int64_t{work.split.tiles} * Cfg::kClusterCtas, work.split.max_parts, Cfg::kBlockM,
                                kHeadDim);
    // No workspace could be made during a graph capture (stream_buffer): every item whole.
    if (!workspace.ok()) work.run_whole();
  }
  kp.split = {work.split, workspace.tickets, workspace.lse, workspace.o};
  kp.tile_counter = kp.features.persistent && kp.features.dynamic ? tile_counter(stream) : nullptr;
  if (kp.features.persistent && kp.features.dynamic && kp.tile_counter == nullptr) {
    // No counter can be made during a graph capture: schedule like FUSEDATTN_SM90_DYNAMIC=0 (a
    // cluster's CTAs stay persistent, on the static schedule).
    kp.features.dynamic = false;
    kp.features.persistent = kMask == MaskKind::kFull || kClustered;
  }
  // A clustered launch is persistent (above), a cluster of kClusterCtas CTAs per slot.
  const int64_t slots_used =
      kp.features.persistent ? std::min<int64_t>(work.items() - first_item, slots) : work.items();
  const int64_t grid = slots_used * Cfg::kClusterCtas;
#ifdef FUSEDATTN_SM90_TRACE
  const TraceSink trace(stream);
  kp.trace = trace.buffer(grid);
#endif
  // Column masks: the summary over this tile's KV blocks, written on the stream before the kernel.
  const ColumnScratch columns = kMask == MaskKind::kColumn ? ColumnScratch::of<Cfg::kBlockN>(p) : ColumnScratch{};
  kp.columns = columns.summary;
  const ClusterLaunch launch(grid, Cfg::kThreads, kSmemBytes, stream, Cfg::kClusterCtas,
                             slice != nullptr ? slice->dependent : dependent_launch(),
                             slice != nullptr ? slice->started : nullptr);
  FUSEDATTN_CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, kp));
  FUSEDATTN_CHECK_LAUNCH();
  columns.release(stream);
#ifdef FUSEDATTN_SM90_TRACE
  trace.write();
#endif
  // Every launch leaves the stream's counter at zero for the next. A variable-length one cannot
  // tell its last fetch (tile_scheduler.cuh), so the stream zeroes it behind the kernel.
  if (varlen && kp.tile_counter != nullptr)
    FUSEDATTN_CUDA_CHECK(cudaMemsetAsync(kp.tile_counter, 0, sizeof(int), stream));
  return true;
}

// The second stream of the quad mix on the current device, made on first use and kept for the
// process, as the device's other per-stream state (split_workspace.h, tile_counter.h).
inline cudaStream_t quad_mix_stream() {
  constexpr int kMaxDevices = 64;
  static std::atomic<cudaStream_t> streams[kMaxDevices];
  int device = 0;
  FUSEDATTN_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) return nullptr;
  if (cudaStream_t s = streams[device].load()) return s;
  cudaStream_t made = nullptr;
  FUSEDATTN_CUDA_CHECK(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking));
  cudaStream_t expected = nullptr;
  if (streams[device].compare_exchange_strong(expected, made)) return made;
  FUSEDATTN_CUDA_CHECK(cudaStreamDestroy(made));  // another thread made one first
  return expected;
}

// The quad mix (fwd_split.h, uses_quad_mix): the pairs' work items (pairs of query blocks) split
// between a launch of clusters of kMixCtas (four or eight; "the quads" below), on the caller's
// stream, and a pair launch on the SMs no such cluster fits. Eagerly the pairs run on a second
// stream forked from the caller's and joined back into it; in a graph capture, where a shared
// second stream would join the capture, on the caller's stream beside the quads (CapturedFork).
// Each takes a share of the items (QuadMixShares: the later launch ends first); the quads take the
// first ones (a quad item is kMixCtas / 2 pair items: the same kMixCtas query blocks). Returns
// false, having launched nothing, where that cannot run: no quad or no pair beside them fits, or
// there is no second stream; the caller then runs the pairs alone.
template <typename Element, int kHeadDim, MaskKind kMask, TileShape kShape, int kMixCtas>
bool launch_cluster_mix(const FwdParams& p, const TiledRows& rows, int num_sms) {
  constexpr TileShape kMixShape = mix_clusters(kShape, kMixCtas);
  using MixCfg = KernelConfig<Element, kHeadDim, kMixShape>;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const bool captured = capturing(stream);
  constexpr auto kMixKernel = fwd_kernel<Element, MixCfg, kMask>;
  constexpr int kSmemBytes = shared_bytes<Element, MixCfg>();
  const int64_t quad_clusters =
      launch_slots<kMixKernel, kMixCtas>(MixCfg::kThreads, kSmemBytes, MixCfg::kCtasPerSm, num_sms);
  // The pairs run on the SMs the quads leave. The occupancy API answers for an empty device, so
  // this asks it whether every SM pairs up there (as on the H200: 66 pairs of 132 SMs), of the
  // quad kernel, whose resources are the pair kernel's. Then every GPC holds an even number of
  // SMs, and those its quads leave pair up too. Elsewhere a pair cluster could wait for the quads
  // to end, and under the static schedule its items would run after theirs.
  const int64_t all_pairs = max_active_clusters<kMixKernel, kPairCluster>(MixCfg::kThreads, kSmemBytes);
  const int64_t pair_clusters = (num_sms - quad_clusters * kMixCtas) / kPairCluster;
  const cudaStream_t side = captured ? stream : quad_mix_stream();
  if (quad_clusters == 0 || pair_clusters <= 0 || all_pairs * kPairCluster != num_sms || side == nullptr) return false;
  const QuadMixShares shares{cluster_items(rows.blocks(kShape.block_m), kPairCluster) * rows.heads * p.batch,
                             quad_clusters, pair_clusters, quad_round_percent(), kMixCtas / kPairCluster};
  const int64_t quad_items = shares.quad_items();
  const auto launch_quads = [&](bool dependent, cudaEvent_t started) {
    const ClusterSlice share{0, quad_items, quad_clusters, stream, dependent, started};
    launch_fwd<Element, kHeadDim, kMask, kMixShape>(p, rows, num_sms, &share);
  };
  const auto launch_pairs = [&] {
    const ClusterSlice share{shares.pair_begin(quad_items), shares.pairs, pair_clusters, side, false, nullptr};
    launch_fwd<Element, kHeadDim, kMask, paired(kShape)>(p, rows, num_sms, &share);
  };
  if (captured) {
    // No edge orders the pairs: one from the quads' launch-completion port serialised them
    // behind the quads (docs/hopper.md, session 95). The quads keep the dependent launch.
    CapturedFork fork(stream);
    launch_quads(dependent_launch(), nullptr);
    fork.before_second();
    launch_pairs();
    fork.join();
    return true;
  }
  // Destroyed on every way out (a throwing launch included); CUDA releases them once the work
  // recorded on them completes.
  struct Events {
    cudaEvent_t fork = nullptr, started = nullptr, join = nullptr;
    ~Events() {
      for (cudaEvent_t e : {fork, started, join})
        if (e != nullptr) (void)cudaEventDestroy(e);
    }
  } events;
  for (cudaEvent_t* e : {&events.fork, &events.started, &events.join})
    FUSEDATTN_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  // The quads first, so that the pairs' clusters find the SMs the quads leave: the pairs wait for
  // the caller's work before the call (the fork) and for every quad block to have begun (the
  // quads' launch-completion event). The quads are therefore no dependent launch: as one they
  // start early behind a kernel and take their GPCs first, but behind an event wait (the call
  // before's join, where calls run back to back) both launches became ready at once, and with
  // the quads dependent the event fired only at their end, even with the pairs skipping their
  // grid wait (docs/hopper.md, sessions 95 and 106). H100, d256 full 2k/4k/16k, ours / cuDNN back
  // to back: 0.94-0.99x with dependent quads, 1.09-1.14x without; behind a copy kernel without
  // 0.2-1.4% slower, in do_bench's calls 1-4% slower.
  FUSEDATTN_CUDA_CHECK(cudaEventRecord(events.fork, stream));
  FUSEDATTN_CUDA_CHECK(cudaStreamWaitEvent(side, events.fork, 0));
  launch_quads(/*dependent=*/false, events.started);
  FUSEDATTN_CUDA_CHECK(cudaStreamWaitEvent(side, events.started, 0));
  launch_pairs();
  FUSEDATTN_CUDA_CHECK(cudaEventRecord(events.join, side));
  FUSEDATTN_CUDA_CHECK(cudaStreamWaitEvent(stream, events.join, 0));
  return true;
}

// The mix of mix_ctas-CTA clusters (quad_mix_ctas: kQuadCluster or kOctetCluster), or of quads
// where no octet fits the GPU (query blocks in eights come in fours too).
template <typename Element, int kHeadDim, MaskKind kMask, TileShape kShape>
bool launch_quad_mix(const FwdParams& p, const TiledRows& rows, int num_sms, int mix_ctas) {
  if (mix_ctas == kOctetCluster &&
      launch_cluster_mix<Element, kHeadDim, kMask, kShape, kOctetCluster>(p, rows, num_sms))
    return true;
  return launch_cluster_mix<Element, kHeadDim, kMask, kShape, kQuadCluster>(p, rows, num_sms);
}

// kShape, or kShape in a cluster of two where uses_pair_cluster says so (fwd_split.h) and the
// GPU fits such clusters, or kShape's decode kernel for decode steps where it has one
// (runs_decode_tile).
template <typename Element, int kHeadDim, MaskKind kMask, TileShape kShape>
void launch_fwd_maybe_paired(const FwdParams& p, const TiledRows& rows, int num_sms) {
  if constexpr (kMask == MaskKind::kWindow && has_masked_pair_cluster(kHeadDim, kShape.block_n)) {
    if (uses_pair_cluster(p, kMask, kHeadDim, rows, kShape) &&
        launch_fwd<Element, kHeadDim, kMask, paired(kShape)>(p, rows, num_sms))
      return;
  }
  if constexpr (kMask == MaskKind::kFull && has_pair_cluster(kHeadDim)) {
    if (uses_pair_cluster(p, kMask, kHeadDim, rows, kShape)) {
      if constexpr (has_quad_mix(kHeadDim) && kShape.block_n == block64_tile(kHeadDim).block_n)
        if (const int mix_ctas = quad_mix_ctas(p, kMask, kHeadDim, rows);
            mix_ctas != 0 && launch_quad_mix<Element, kHeadDim, kMask, kShape>(p, rows, num_sms, mix_ctas))
          return;
      if (launch_fwd<Element, kHeadDim, kMask, paired(kShape)>(p, rows, num_sms)) return;
    }
  }
  using DecodeConsumer = Consumer<Element, KernelConfig<Element, kHeadDim, decode_tile(kShape)>, kMask>;
  if constexpr (DecodeConsumer::kWarpSplitCopy) {
    static_assert(DecodeConsumer::kHalfWarpRows == kDecodeTileRows, "decode steps' rows are the one-row slices'");
    if (runs_decode_tile(rows)) {
      launch_fwd<Element, kHeadDim, kMask, decode_tile(kShape)>(p, rows, num_sms);
      return;
    }
  }
  launch_fwd<Element, kHeadDim, kMask, kShape>(p, rows, num_sms);
}

// Whether GQA groups are packed into tiles, and d64's, d192's and d256's tiles, are chosen per launch
// (fwd_split.h: tiled_rows, d64_tile, uses_block64), and the clusters (uses_pair_cluster).
template <typename Element, int kHeadDim, MaskKind kMask>
void run_fwd(const FwdParams& p) {
  const int num_sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  const TiledRows rows = tiled_rows(p, kHeadDim, kMask, num_sms);
  // Column masks run d64's pair or 128 x 128 tile (fwd_split.h, d64_tile), never the 192-row one
  // (its three consumer warpgroups would get 152 registers beside the column producer's 40, not the
  // 160 the tile is laid out for), so that kernel is not compiled for them.
  if constexpr (kHeadDim == 64) {
    switch (d64_tile(kMask, rows.rows, keys_per_row(p), loads_unwritten_rows(p))) {
      case D64Tile::kTall:
        if constexpr (kMask != MaskKind::kColumn) {
          launch_fwd<Element, kHeadDim, kMask, kD64Tall>(p, rows, num_sms);
          return;
        }
        break;
      case D64Tile::kPair: launch_fwd<Element, kHeadDim, kMask, kD64Pair>(p, rows, num_sms); return;
      case D64Tile::kTable: break;
    }
  }
  if constexpr (has_block64_tile(kHeadDim)) {
    if (runs_block64(kHeadDim, p, kMask, rows))
      return launch_fwd_maybe_paired<Element, kHeadDim, kMask, block64_tile(kHeadDim)>(p, rows, num_sms);
  }
  launch_fwd_maybe_paired<Element, kHeadDim, kMask, tile_shape(kHeadDim)>(p, rows, num_sms);
}

// The clustered kernels and the decode kernels are compiled in translation units of their own
// (src/cuda/instances/sm90_fwd_*_pair_n*.cu, *_quads_n*.cu, *_decode_n*.cu), one kernel each;
// tools/gen_instances.py writes them and the list of their declarations.
#define FUSEDATTN_SM90_LAUNCH(Element, kHeadDim, kMask, kTile)                                        \
  extern template bool launch_fwd<Element, kHeadDim, kMask, kTile>(const FwdParams&, const TiledRows&, int, \
                                                                  const ClusterSlice*);
#define FUSEDATTN_SM90_CLUSTER_MIX(Element, kHeadDim, kTile, kMixCtas)                                     \
  extern template bool launch_cluster_mix<Element, kHeadDim, MaskKind::kFull, kTile, kMixCtas>( \
      const FwdParams&, const TiledRows&, int);
#include "cuda/sm90/unit_instances.inc"
#undef FUSEDATTN_SM90_LAUNCH
#undef FUSEDATTN_SM90_CLUSTER_MIX

}  // namespace fusedattn::cuda::sm90
