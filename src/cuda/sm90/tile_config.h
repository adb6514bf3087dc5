// Tile sizes and resource budget of the Hopper forward kernel, per head dim: one constexpr table
// that host code (launch, shared-memory size) and device code read alike.
#pragma once

#include <cstdint>

#include "cuda/common/int_math.h"

namespace fusedattn::cuda::sm90 {

struct TileShape {
  int block_m;              // query rows per CTA tile: consumer_warpgroups slices of 64
  int block_n;              // keys per KV block
  int stages;               // depth of the K/V shared-memory pipeline
  int consumer_warpgroups;  // 64-row slices, one per consumer warpgroup (each takes GEMM turns)
  int ctas_per_sm = 1;      // CTAs resident per SM: they share its registers and shared memory
  int v_stages = 0;         // depth of the V ring where it is deeper than K's (0: `stages`)
  int cluster_ctas = 1;     // CTAs per cluster sharing each K/V block by TMA multicast (kPairCluster)
  bool decode = false;      // decode steps' kernel: compiles the warp-split loop (decode_tile)
};

// d128's V ring is a stage deeper than its K ring: a V stage is held from its load until P V has
// completed, about a step longer than K (given back once Q K^T has completed), so with two V
// stages a V load has only about one step to land, less than an L2 miss takes at short sequences
// (docs/hopper.md, session 22). 2 Q buffers + 2 K + 3 V stages of 32 KiB: 224 KiB.
constexpr int kD128VStages = 3;

// d64/d128: 128x128 keeps S (64 fp32/thread) + O + P inside 240 registers; d96 (session 30)
// runs d128's tile (its shared-memory tiles are d128's, the last slab half used): 0.88-0.90x the
// d128 kernel's time at the same shape, its softmax per 128-key block unchanged (docs/hopper.md,
// session 31); a 176-key block (one Q buffer, O staged in K/V) read 0.85-0.97x this tile up to
// 4k keys and 0.98-1.02x from 8k (session 32). d256: O alone takes 128 registers per thread, so
// the KV block shrinks to 80 keys (S 40 + P 20 registers; 2 stages of 80 KiB + Q 64 KiB = 224
// KiB); 80 beat 64 by 1-3% (docs/hopper.md, session 3; since session 20 64 wins under short
// masks, kD256Block64). A 176-key block at d128 (full mask) lost 3-8% to 128 (it spills), and a
// third d128 K/V stage (one Q buffer) bought nothing.
// d192 (session 30): O takes 96 registers, so with a 112-key block S (56) + P (28) + O take 180,
// close to d256's 188 with 80 keys (O 128 + S 40 + P 20); 2 stages of 2 x 42 KiB + one 48 KiB Q
// buffer: 216 KiB. Chosen by that register and shared-memory budget; against 64-key blocks see
// fwd_split.h (uses_block64).
constexpr TileShape kD192{128, 112, 2, 2};
constexpr TileShape tile_shape(int head_dim) {
  if (head_dim <= 64) return {128, 128, 3, 2};
  if (head_dim <= 128) return {128, 128, 2, 2, 1, kD128VStages};
  if (head_dim <= 192) return kD192;
  return {128, 80, 2, 2};
}

// d64 also has a 192-row tile for long query sequences (fwd_launch.cuh chooses): three consumer
// warpgroups of 64 rows take GEMM turns round robin, so one more warp per scheduler hides the
// softmax between turns. At 160 registers per consumer thread S (64) + P (32) + O (32) of the
// intra-warpgroup overlap leave 32 for everything else: the consumers carry little per tile
// (docs/hopper.md, session 6), and its cut blocks wait for P V before the mask (consumer.cuh).
// Four K/V stages (2 Q buffers of 24 KiB + 4 x 32 KiB = 176 KiB): since its K is held until the
// step's sum check, a fourth stage bought causal 2k-8k +0.5-2% (full masks even; session 23).
constexpr TileShape kD64Tall{192, 128, 4, 3};

// d64 for short sequences: two CTAs per SM, so one CTA's tile boundary (epilogue, the next tile's
// first Q K^T and softmax alone) runs beside the other's KV loop. Half the register file each
// leaves 104 per consumer thread: S (32) + P (16) + O (32) of a 64-key block, too few for the
// intra-warpgroup overlap (Consumer::kOverlaps); 4 stages of 16 KiB + 2 Q buffers: 96 KiB each.
// docs/hopper.md, session 20.
constexpr TileShape kD64Pair{128, 64, 4, 2, 2};

// d256 under masks with at most kBlock64MaxKeys keys (fwd_split.h): 64-key blocks, so a
// 128-row causal tile's diagonal is two whole blocks (80-key blocks cut 512 queries into 6.4) and
// each step's softmax is shorter. 2 stages of 64 KiB + one 64 KiB Q buffer: 192 KiB.
constexpr TileShape kD256Block64{128, 64, 2, 2};

// d192 under the same rule as kD256Block64 (fwd_split.h: uses_block64): 64-key blocks where rows
// see few keys. 2 stages of 2 x 24 KiB leave room for two 48 KiB Q buffers (the next tile's Q
// loads under this one's epilogue, as at d128): 192 KiB.
constexpr TileShape kD192Block64{128, 64, 2, 2};

// A cluster of two CTAs on two adjacent query tiles of one (head, batch): they need the same K/V
// blocks, so each CTA loads half the rows of every block and multicasts them into both, which
// halves the K/V traffic out of the L2. Under the power cap that traffic costs clock: at d256
// full 8k each SM reads ~40 GB/s of K/V at ~18.5 J/TB, up to ~100 W of the board's 690 W, and
// with half the K/V loads issued the kernel ran 7% faster at a 125 MHz higher clock (H200 fp16,
// docs/hopper.md, session 35). The stage's empty barriers count both CTAs' consumer warps, so
// neither CTA refills a stage the other still reads.
constexpr int kPairCluster = 2;
constexpr TileShape paired(TileShape shape) {
  shape.cluster_ctas = kPairCluster;
  return shape;
}
// The quad mix's clusters on d256's 64-key tile. Of four CTAs (kQuadCluster), each loads 16 rows
// (two swizzle atoms) of every K/V block: a quarter of the K/V reads out of the L2. The H200 fits
// only 30 (120 of its SMs), so they run beside a pair launch on the SMs left (fwd_split.h,
// uses_quad_mix). Of eight (kOctetCluster, where the query blocks come in eights), each loads one
// swizzle atom (8 rows), an eighth of the reads; the H200 fits 15, the same 120 SMs.
constexpr int kQuadCluster = 4;
constexpr int kOctetCluster = 8;
constexpr TileShape mix_clusters(TileShape shape, int ctas) {
  shape.cluster_ctas = ctas;
  return shape;
}

// The kernel of decode steps (launches of at most kDecodeTileRows tiled rows, fwd_split.h:
// runs_decode_tile) on a tile whose one-row slices may split each block's keys over the warps
// (Consumer::kWarpSplitCopy, warp_split.cuh): a kernel of its own, so that the loop is not compiled
// into the prefill kernels. With it compiled in, ptxas schedules the whole kernel anew, and the
// prefill tiles, which never enter it, ran slower: H200, tools/ab_build.sh, five rounds, the
// speed with / without it, fp16 d128 full 2k 0.990, 8k 0.991, bf16 d128 full 2k 0.991, d64 full 2k
// 1.000, 512 1.005 (docs/hopper.md, session 103).
constexpr TileShape decode_tile(TileShape shape) {
  shape.decode = true;
  return shape;
}

// A cluster launch's work items per (head, batch): its query blocks in groups of cluster_ctas, the
// last group short where the count does not divide. One rule for the host's work list
// (fwd_split.h, fwd_work) and the kernel's scheduler (tile_scheduler.cuh, tile_at).
template <typename Int>
constexpr Int cluster_items(Int query_blocks, int cluster_ctas) {
  return ceil_div(query_blocks, cluster_ctas);
}

constexpr int kWarpgroupThreads = 128;
constexpr int kWarpsPerWarpgroup = kWarpgroupThreads / 32;
constexpr int kWarpgroupRows = 64;  // a wgmma M tile: each consumer warpgroup owns 64 query rows
constexpr int kMaxConsumerWarpgroups = 3;  // named barriers are laid out for this many (named_barriers.h)
// Tile announcements in flight (tile_announcement.cuh): the producer publishes the next tile's
// while the consumers may still read the current one's (the 192-row tile's epilogue does).
constexpr int kAnnouncementSlots = 2;
// A split tile's last part combines the parts spread over the warpgroup where the slice's rows in
// use come to at most one chunk of kSpreadChunkCols columns a thread (split_combine.cuh, spreads).
// Launches of fewer tiles than SMs whose tiles all combine so (decode steps: a packed GQA group)
// may cut a tile into up to kFewRowsMaxParts parts (fwd_split.h, few_rows_parts): the spread
// combine reads every part at once, kFewRowsMaxParts being its unrolled bound.
constexpr int kSpreadChunkCols = 8;
constexpr int kFewRowsMaxParts = 32;
// The spread combine's holders: the warpgroup's first threads, which hold a slice's first rows
// (row r in lanes 4 (r % 8) .. + 3 of warp r / 16, two rows a thread); every thread takes float4
// groups of one of them.
constexpr int spread_holders(int rows) { return rows <= 4 ? 16 : rows <= 16 ? 32 : rows <= 32 ? 64 : kWarpgroupThreads; }
// A consumer thread's float4 groups of O (64 rows x the instance's head dim over the warpgroup).
constexpr int kFloat4Floats = 4;
constexpr int accumulator_float4s(int instance_head_dim) {
  return kWarpgroupRows * instance_head_dim / kWarpgroupThreads / kFloat4Floats;
}
// The float4 groups of each part a thread takes where `holders` threads hold the rows.
constexpr int spread_groups(int holders, int instance_head_dim) {
  return ceil_div(holders * accumulator_float4s(instance_head_dim), kWarpgroupThreads);
}
// More groups a thread (or more loads in flight) spilled above d128: 28-88 B in the d256 instances.
constexpr int max_spread_groups(int instance_head_dim) { return instance_head_dim > 128 ? 4 : 8; }
// Whether a split slice of `rows` rows in use at head_dim, on the instance for instance_head_dim,
// combines spread: its rows in use come to at most one chunk a thread and their holders' float4
// groups to at most max_spread_groups a thread. The one rule of the plan's few-row launches
// (fwd_split.h) and the kernel (SplitCombine::spreads), so a plan never cuts a tile into more parts
// than its combine takes at once.
template <typename Int>
constexpr bool combine_spreads(Int rows, int head_dim, int instance_head_dim) {
  return rows * (head_dim / kSpreadChunkCols) <= kWarpgroupThreads &&
         spread_groups(spread_holders(static_cast<int>(rows)), instance_head_dim) <= max_spread_groups(instance_head_dim);
}
constexpr int kRegisterFileSize = 65536;
constexpr int kProducerRegisters = 24;  // setmaxnreg's minimum: the producer only issues TMA loads
// Under a column mask the producer warp also walks each tile's key blocks through the mask's
// summary (sm90/column_producer.cuh): on 24 registers that spilled 44-200 B, on 32 still 48-60 B
// (d64/d128), on 40 nothing. Its consumers take what is left (232 in the 128 x 128 tiles).
constexpr int kColumnProducerRegisters = 40;
constexpr int kMaxRegistersPerThread = 256;
constexpr int kRegisterGranule = 8;  // setmaxnreg counts are multiples of 8

// The registers a CTA of `threads` starts with when ctas_per_sm of them share the register file
// (__launch_bounds__(threads, ctas_per_sm) caps each thread at its share, in granules).
constexpr int launch_registers(int threads, int ctas_per_sm) {
  const int per_thread = kRegisterFileSize / (ctas_per_sm * threads) / kRegisterGranule * kRegisterGranule;
  return per_thread < kMaxRegistersPerThread ? per_thread : kMaxRegistersPerThread;
}

// What the consumers get after setmaxnreg: what the CTA started with less the producer's share,
// evenly and rounded down to setmaxnreg's granule (setmaxnreg moves registers within a CTA only).
// One CTA per SM: 2 consumer warpgroups 240, 3: 160; two CTAs per SM with 2: 104.
constexpr int consumer_registers(int consumer_warpgroups, int ctas_per_sm, int producer_registers = kProducerRegisters) {
  const int threads = (1 + consumer_warpgroups) * kWarpgroupThreads;
  const int pool = launch_registers(threads, ctas_per_sm) * threads - kWarpgroupThreads * producer_registers;
  const int per_thread = pool / (consumer_warpgroups * kWarpgroupThreads) / kRegisterGranule * kRegisterGranule;
  return per_thread < kMaxRegistersPerThread ? per_thread : kMaxRegistersPerThread;
}

constexpr int kMaxSharedBytesPerBlock = 227 * 1024;  // sm_90 opt-in limit per block
constexpr int kMaxSharedBytesPerSm = 228 * 1024;     // what the CTAs on one SM share
constexpr int kReservedSharedBytesPerBlock = 1024;   // reserved by the system for each CTA
// The dynamic shared memory one CTA may take when ctas_per_sm of them share an SM.
constexpr int shared_bytes_per_cta(int ctas_per_sm) {
  const int share = kMaxSharedBytesPerSm / ctas_per_sm - kReservedSharedBytesPerBlock;
  return share < kMaxSharedBytesPerBlock ? share : kMaxSharedBytesPerBlock;
}
#ifndef FUSEDATTN_SM90_WARPGROUP_Q
#define FUSEDATTN_SM90_WARPGROUP_Q 1
#endif
constexpr int kSwizzleBytes = 128;                   // TMA/wgmma 128-byte swizzle span (one smem row)

template <typename Element, int kHeadDim_, TileShape kShape_ = tile_shape(kHeadDim_)>
struct KernelConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr TileShape kShape = kShape_;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kStages = kShape.stages;  // the K ring's depth
  static constexpr int kVStages = kShape.v_stages > kShape.stages ? kShape.v_stages : kShape.stages;
  static constexpr int kConsumerWarpgroups = kShape.consumer_warpgroups;
  static constexpr int kCtasPerSm = kShape.ctas_per_sm;
  static constexpr int kClusterCtas = kShape.cluster_ctas;
  // Rows of a K/V block each CTA of the cluster loads (and multicasts).
  static constexpr int kClusterBlockRows = kShape.block_n / kShape.cluster_ctas;
  static constexpr int kSharedBytesLimit = shared_bytes_per_cta(kCtasPerSm);
  static constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;  // producer + consumers
  static constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpsPerWarpgroup;
  static constexpr int kConsumerRegisters = consumer_registers(kConsumerWarpgroups, kCtasPerSm);
  // Beside the column-mask producer (kColumnProducerRegisters).
  static constexpr int kColumnConsumerRegisters =
      consumer_registers(kConsumerWarpgroups, kCtasPerSm, kColumnProducerRegisters);
  // A tile row of kHeadDim elements is stored as "slabs" of 128 bytes each, so every slab is a
  // plain 128B-swizzled [rows x 64] tile the TMA box and wgmma agree on. A head dim that is not a
  // multiple of 64 (d96) fills its last slab half: the TMA box past the tensor's columns
  // zero-fills it on load and skips it on store, and the GEMMs never read it (Q K^T stops at
  // kHeadDim's k-steps, P V's N is kHeadDim). The shared-memory tiles hold kSlabs whole slabs.
  static constexpr int kSlabCols = kSwizzleBytes / static_cast<int>(sizeof(Element));
  static constexpr int kSlabs = ceil_div(kHeadDim, kSlabCols);
  static constexpr int kTileCols = kSlabs * kSlabCols;  // columns of a shared-memory tile row
  // Two Q buffers where they fit beside the K/V stages (d64: 128 KiB, d128: 192 KiB), so the
  // producer can load the next tile's Q while the consumers still work on (and stage O in) this
  // tile's; d256 (2 x 64 KiB Q + 160 KiB K/V) keeps one. kBarrierBytes: the barriers and tile
  // indices after the 1024-aligned buffers.
  static constexpr int kQTileBytes = kBlockM * kTileCols * static_cast<int>(sizeof(Element));
  static constexpr int kKVTileBytes = kBlockN * kTileCols * static_cast<int>(sizeof(Element));
  static constexpr int kBarrierBytes = 1024;
  static constexpr int kQBuffers =
      2 * kQTileBytes + (kStages + kVStages) * kKVTileBytes + kBarrierBytes <= kSharedBytesLimit ? 2 : 1;
  // With one Q buffer (d256) the next tile's Q could load only after this tile's O had been
  // staged in it and stored, so its whole latency sat on every tile boundary. There each
  // warpgroup gives Q back after its last Q K^T instead, and the two warpgroups stage O in the
  // stage of the tile's last KV block (warpgroup 0 in its K, 1 in its V; a 64-row slice fits in a
  // KV tile), which the producer refills only for the next tile's second block.
  // In a cluster every CTA's producer refills the stage in all of them (multicast), so each waits
  // until the stores of every CTA have read their O there (o_read counts them all).
  static constexpr bool kStagesOInKV = kQBuffers == 1 && kConsumerWarpgroups == 2 && kBlockN >= kWarpgroupRows;
  // Q per warpgroup (kWarpgroupQ): where one Q tile is all that fits beside the K/V stages but
  // three 64-row slots do (d256's 64-key tile: 3 x 32 KiB + 4 x 32 KiB of K/V = 224 KiB), Q lives
  // in slots of one warpgroup's rows, each with its own barriers. Warpgroup 0 takes slots 0 and 1
  // in turn: the producer loads its next tile's rows during this tile, not at the boundary, and
  // it stages O in its own slot, so it no longer waits for warpgroup 1's last Q K^T to stage O in
  // the last block's K (Epilogue::meet). Warpgroup 1 keeps slot 2, which it gives back after its
  // last Q K^T, and stages O in the last block's V as before. docs/hopper.md, session 46.
  // -DFUSEDATTN_SM90_WARPGROUP_Q=0 builds the one shared Q tile instead (an ablation switch).
  static constexpr int kWarpgroupQSlotBytes = kWarpgroupRows * kTileCols * static_cast<int>(sizeof(Element));
  static constexpr int kWarpgroupQSlots = 3;
  static constexpr bool kWarpgroupQ =
      FUSEDATTN_SM90_WARPGROUP_Q != 0 && kStagesOInKV &&
      kWarpgroupQSlots * kWarpgroupQSlotBytes + (kStages + kVStages) * kKVTileBytes + kBarrierBytes <= kSharedBytesLimit;
  // The Q slots in shared memory: whole tiles (kQBuffers of kBlockM rows, both warpgroups' rows
  // in each) or, with kWarpgroupQ, one warpgroup's 64 rows each.
  static constexpr int kQSlots = kWarpgroupQ ? kWarpgroupQSlots : kQBuffers;
  static constexpr int kQSlotRows = kWarpgroupQ ? kWarpgroupRows : kBlockM;
  static_assert(!kStagesOInKV || kVStages == kStages, "O staged in a K/V stage pairs a K stage with the V stage of its index");
  static_assert(kHeadDim % kSlabCols == 0 || kHeadDim % kSlabCols == kSlabCols / 2,
                "head dim must fill whole 64-column slabs or end on half of one");
  static_assert(kBlockM == kConsumerWarpgroups * kWarpgroupRows, "one 64-row slice per consumer warpgroup");
  static_assert(kConsumerWarpgroups >= 2 && kConsumerWarpgroups <= kMaxConsumerWarpgroups,
                "the GEMM turns need a partner; named barriers exist for kMaxConsumerWarpgroups");
  static_assert(kWarpgroupThreads * kProducerRegisters + kConsumerWarpgroups * kWarpgroupThreads * kConsumerRegisters <=
                launch_registers(kThreads, kCtasPerSm) * kThreads);
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "wgmma k-steps are 16 wide");
  // Each CTA's share of a K/V block starts on a 128B-swizzle atom (8 rows of 128 bytes), so the
  // swizzle pattern of its box is the one the whole block's wgmma descriptors assume.
  static_assert(kBlockN % (kClusterCtas * 8) == 0, "a cluster CTA's share of a K/V block must be whole swizzle atoms");
  static_assert(kClusterCtas == 1 ||
                    ((kClusterCtas == kPairCluster || kClusterCtas == kQuadCluster || kClusterCtas == kOctetCluster) &&
                     kCtasPerSm == 1),
                "clusters of two, four or eight one-CTA-per-SM tiles");
};

}  // namespace fusedattn::cuda::sm90
