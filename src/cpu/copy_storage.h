// Storage for the CPU forward's transposed copy of K (transposed_rows.h), kept by the calling
// thread from one call to the next (up to kRetainFloats) and never zeroed. A fresh zeroed vector
// per call cost two ways: the zeroing ran on the calling thread alone, and where the allocator
// hands such blocks back to the system between calls (through torch; not in the CLI, whose
// allocations repeat exactly) every call faulted all of the copy's pages in again, ~960 faults for
// B1 H8 S1024 D64 and 1-2 ms of its 12-13 ms forward (docs/perf.md, fifty-third session). What an
// earlier call left there reaches no result: a call uses only the floats it writes.
#pragma once

#include <cstddef>
#include <memory>

#include "cpu/isa.h"

namespace fusedattn::cpu::FUSEDATTN_CPU_ISA {

// One lease of the calling thread's kept block at a time; a second lease alive at once gets
// storage of its own, freed with it.
class CopyStorage {
 public:
  static constexpr size_t kRetainFloats = size_t{4} << 20;  // 16 MiB per calling thread

  explicit CopyStorage(size_t floats) {
    Cache& cache = thread_cache();
    if (cache.leased) {
      own_.reset(new float[floats]);
      data_ = own_.get();
      return;
    }
    if (cache.size < floats) {
      cache.data.reset();  // the old block first, so both are never held at once
      cache.size = 0;      // and none is claimed if the allocation throws
      cache.data.reset(new float[floats]);
      cache.size = floats;
    }
    cache.leased = true;
    leased_ = true;
    data_ = cache.data.get();
  }
  ~CopyStorage() {
    if (!leased_) return;
    Cache& cache = thread_cache();
    cache.leased = false;
    if (cache.size > kRetainFloats) {
      cache.data.reset();
      cache.size = 0;
    }
  }
  CopyStorage(const CopyStorage&) = delete;
  CopyStorage& operator=(const CopyStorage&) = delete;

  float* data() const { return data_; }

 private:
  struct Cache {
    std::unique_ptr<float[]> data;
    size_t size = 0;
    bool leased = false;
  };
  static Cache& thread_cache() {
    thread_local Cache cache;
    return cache;
  }
  std::unique_ptr<float[]> own_;
  float* data_ = nullptr;
  bool leased_ = false;
};

}  // namespace fusedattn::cpu::FUSEDATTN_CPU_ISA
