// What the check of a variable-length call's offsets (and paged table) can find at fault, as one
// record the host check and the device check (offsets_check.cu) fill alike, so that both report
// it in the same words (api/validate.cpp: detail::fault_error).
#pragma once

#include <cstdint>

namespace fusedattn {

enum class OffsetsFaultKind : int32_t {
  kNone = 0,
  // In the order the host check meets them within one sequence (the device check reports the
  // lowest, offsets_check.cu).
  kFirstNotZero,    // entry 0 (value) is not 0
  kDecreasing,      // entry `entry` (value) is below entry `entry` - 1 (bound)
  kPastRows,        // entry `entry` (value) passes the packed tensor's rows (bound)
  kTooLong,         // sequence `sequence` has length value, above max_seqlen (bound)
  kPagesPastTable,  // sequence `sequence`'s value keys need more pages of `detail` rows than the
                    // table's bound columns
  kPageOutside,     // table entry [sequence, entry] (value) is outside [0, bound)
};

struct OffsetsFault {
  int32_t kind = 0;  // OffsetsFaultKind
  int32_t keys = 0;  // 1: cu_seqlens_k / max_seqlen_k / block_table; 0: cu_seqlens_q / max_seqlen_q
  int64_t sequence = 0;
  int64_t entry = 0;
  int64_t value = 0;
  int64_t bound = 0;
  int64_t detail = 0;  // kPagesPastTable: the page size
};

}  // namespace fusedattn
