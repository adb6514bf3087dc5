// Device memory of the split tiles (fwd_split.h): each part's normalised fp32 O rows and LSE, and
// one ticket counter per (split tile, consumer warpgroup) that tells the last part to combine.
// One buffer per (device, stream), like the tile counter, grown on demand; its counters start at
// zero and every launch leaves them at zero (the last part of each slice resets its own).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fusedattn::cuda::sm90 {

struct SplitWorkspace {
  int* tickets = nullptr;    // [split tiles][kMaxConsumerWarpgroups]
  float* lse = nullptr;      // [split tiles][parts][block_m]
  float* o = nullptr;        // [split tiles][parts][block_m][head_dim of the instance]
  bool ok() const { return tickets != nullptr; }
};

// Throws fusedattn::Error(kRuntime) when an allocation fails. Returns an empty workspace (ok()
// false) when the stream's buffer is too small and the stream is being captured into a CUDA graph
// (allocation is not allowed there): the launch then runs every tile whole.
// The counters take a fixed region at the start of the buffer, for up to max_split_tiles split
// tiles (the plan splits fewer than two waves: 2 x the SM count), so a later launch's counters
// never land on an earlier launch's O or LSE slots.
SplitWorkspace split_workspace(cudaStream_t stream, int64_t max_split_tiles, int64_t split_tiles, int parts,
                               int block_m, int head_dim);

}  // namespace fusedattn::cuda::sm90
