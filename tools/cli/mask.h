// The keys a query row sees, written from the API's documented semantics (fusedattn/attention.h:
// bottom-right aligned; causal means window_right = 0; -1 = unbounded) rather than by calling the
// library's key_range(), so the tool's check would also catch a mistake there.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cli_options.h"

namespace fusedattn::cli {

struct KeySpan {
  int64_t lo, hi;  // inclusive; empty when lo > hi (a fully masked row)
  int64_t size() const { return hi >= lo ? hi - lo + 1 : 0; }
};

// With --documents, row i also sees only its own document's keys (RunConfig::documents): written
// from that definition, while the library gets the documents as a column mask.
inline KeySpan visible_keys(const RunConfig& c, int64_t i) {
  const int64_t diag = i + c.seqlen_k - c.seqlen_q;
  // A side wider than both lengths excludes no key: clamped there, diag -/+ it stays in range
  // (--window up to 2^63 - 1 is valid).
  const int64_t widest = c.seqlen_q + c.seqlen_k;
  const int64_t left = std::min(c.window_left, widest);
  const int64_t right = c.causal ? 0 : std::min(c.window_right, widest);
  const RunConfig::Span doc = c.document_of(i);
  const int64_t lo = left >= 0 ? std::max<int64_t>(diag - left, doc.start) : doc.start;
  const int64_t hi = right >= 0 ? std::min(diag + right, doc.end - 1) : doc.end - 1;
  return {lo, hi};
}

}  // namespace fusedattn::cli
