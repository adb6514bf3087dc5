// Environment switches set for one scope. The library reads its switches (FUSEDATTN_DISABLE_SM90,
// FUSEDATTN_BWD_SM80_TILE, ...) at every call and they are process-wide, so a test that left one
// set would silently move every later test in the binary onto another kernel.
#pragma once

#include <cstdlib>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace fusedattn::testing {

// Sets `name` to `value` for the lifetime of the object and unsets it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// Several switches set for one scope (a deque holds them: ScopedEnv does not move); label() is
// "NAME=VALUE ..." for a test's trace.
class ScopedEnvs {
 public:
  explicit ScopedEnvs(const std::vector<std::pair<const char*, const char*>>& settings) {
    for (const auto& [name, value] : settings) {
      envs_.emplace_back(name, value);
      label_ += std::string(name) + "=" + value + " ";
    }
  }
  const std::string& label() const { return label_; }

 private:
  std::deque<ScopedEnv> envs_;
  std::string label_;
};

// The portable (sm80-instruction) forward, also on Hopper.
class PortablePathOnly : public ScopedEnv {
 public:
  PortablePathOnly() : ScopedEnv("FUSEDATTN_DISABLE_SM90", "1") {}
};

}  // namespace fusedattn::testing
