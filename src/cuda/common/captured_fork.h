// Two launches side by side on one stream that is being captured into a CUDA graph, with no
// second stream. Eagerly, two launches run at once on two streams forked and joined by events;
// in a capture, a second stream that waits on the first's event joins that capture until it
// ends, so a stream the library shares between calls could serve neither a second capture nor
// an eager call beside it. Instead the fork sets the capture's dependencies by hand: the second
// launch's node depends on what the first one's did, and the stream afterwards on both nodes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/common/check.cuh"
#include "fusedattn/error.h"

namespace fusedattn::cuda {

class CapturedFork {
 public:
  // Before the first launch on `stream`, which must be capturing.
  explicit CapturedFork(cudaStream_t stream) : stream_(stream), before_(dependencies()) {}

  // After the first launch, before the second: the next node depends on what the first one did.
  void before_second() {
    const std::vector<cudaGraphNode_t> now = dependencies();
    // The first launch added one node, on which the stream now depends, unless it launched
    // nothing (a share without items).
    if (now.size() == 1 && std::find(before_.begin(), before_.end(), now[0]) == before_.end()) first_ = now[0];
    set(before_);
  }

  // After the second launch: whatever follows on the stream depends on both launches.
  void join() {
    std::vector<cudaGraphNode_t> nodes = dependencies();
    if (first_ != nullptr && std::find(nodes.begin(), nodes.end(), first_) == nodes.end()) nodes.push_back(first_);
    set(nodes);
  }

 private:
  // The nodes the stream's next captured node will depend on. The edge data is asked for as
  // well: without it the query fails where any of those edges carries some.
  std::vector<cudaGraphNode_t> dependencies() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t* nodes = nullptr;
    const cudaGraphEdgeData* edges = nullptr;
    size_t count = 0;
    FUSEDATTN_CUDA_CHECK(cudaStreamGetCaptureInfo(stream_, &status, nullptr, nullptr, &nodes, &edges, &count));
    if (status != cudaStreamCaptureStatusActive)
      throw Error(ErrorCode::kRuntime, "stream", "a captured fork needs a stream whose capture is active");
    return std::vector<cudaGraphNode_t>(nodes, nodes + count);
  }

  // Full dependencies (default edge data) on `nodes`.
  void set(std::vector<cudaGraphNode_t> nodes) const {
    FUSEDATTN_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(stream_, nodes.data(), nullptr, nodes.size(),
                                                             cudaStreamSetCaptureDependencies));
  }

  cudaStream_t stream_;
  std::vector<cudaGraphNode_t> before_;
  cudaGraphNode_t first_ = nullptr;
};

}  // namespace fusedattn::cuda
