// What the Hopper forward's tile-boundary trace records (trace.cuh takes the stamps, fwd_launch.cuh
// writes them out, tools/sm90_trace.py reads them): plain structs that host and device code share.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::sm90 {

// The order tools/sm90_trace.py reads them in; append, never renumber.
enum class TraceEvent : uint16_t {
  kTileStart = 0,      // consumer: the tile starts (announcement read, maybe before the previous epilogue; Q may still be loading)
  kFirstKReady = 1,    // consumer: the tile's first K has landed (its first Q K^T may issue)
  kFirstSReady = 2,    // consumer: the first block's S is in registers
  kLastPVDone = 3,     // consumer: the tile's last P V has completed (the KV loop is over)
  kEpilogueDone = 4,   // consumer: O and LSE are on their way out
  kQWaitStart = 5,     // producer: waits for the Q buffer of the next tile
  kQIssued = 6,        // producer: the next tile's Q load is issued
  kLastLoadIssued = 7,  // producer: the tile's last K/V load is issued
  kQReady = 8,          // consumer: the tile's Q has landed (waited for after the set-up, before the first GEMM)
  kOStaged = 9,         // consumer: the epilogue's O is in shared memory (its TMA store not yet issued)
  kEpilogueMet = 10,    // consumer: the epilogue's meeting of the warpgroups is passed (O staged in K/V)
  kORescaled = 11,      // consumer: O divided by the row sums (before the staging barrier)
  kOWritten = 12,       // consumer: this thread's stmatrix stores issued (before the fence and barrier)
  kLoopEntered = 13,    // consumer: the tile's setup done (O zeroed), its first block's wait begins
  kOStoreIssued = 14,   // consumer: the epilogue's TMA store issued (before the LSE is written)
  kFirstTurnTaken = 15,  // consumer: its GEMM turn for a Q K^T alone has come (K landed): the tile's
                         // first block with the overlap (the default), every block without it
  kFirstPReady = 16,     // consumer: the first block's softmax done, P ready for the first overlapped turn
  kFirstKIssued = 17,    // producer: the tile's first K load is issued
  kPartTicketed = 18,    // consumer: a split tile's part written and its ticket drawn (split_combine.cuh)
  kPartsCombined = 19,   // consumer: the last part's combine of every part done (few rows: O written)
  kCombineLoadsIssued = 20,  // consumer: the spread combine's first round of loads issued
  kCombineRoundSummed = 21   // consumer: the spread combine's first round summed (its loads landed)
};

constexpr uint16_t kProducerRole = 0xffff;  // else the consumer warpgroup
// The roles that stamp: the producer and up to three consumer warpgroups (d64's 192-row tile).
constexpr int kTraceRoles = 4;
// A role's stretch of the buffer: the producer's first, then the consumer warpgroups in order.
constexpr int trace_role_slot(int role) { return role == kProducerRole ? 0 : role + 1; }

struct TraceRecord {
  uint64_t clock;   // clock64 of the SM
  uint32_t sm;      // %smid
  uint16_t event;   // TraceEvent
  uint16_t role;    // consumer warpgroup, or kProducerRole
  int32_t tile;     // the tile's index (kNoTile past the end)
  int32_t blocks;   // KV blocks of the tile (consumer stamps), else 0
};
static_assert(sizeof(TraceRecord) == 24);

// Where a launch's stamps go: null records (no FUSEDATTN_SM90_TRACE_FILE) take none. Each (CTA,
// role) owns per_role records from (cta * kTraceRoles + slot) * per_role; the host zeroes them
// first, so a record with clock 0 was not taken.
struct TraceBuffer {
  TraceRecord* records = nullptr;
  unsigned long long* dropped = nullptr;  // stamps past their role's stretch
  // The buffer's records / (CTAs * kTraceRoles), worked out on the host for the launch's grid, so a
  // stamp costs no division on the path it measures.
  uint32_t per_role = 0;
};

}  // namespace fusedattn::cuda::sm90
