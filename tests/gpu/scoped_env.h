// Environment switches set for one scope. The library reads its switches (FUSEDATTN_DISABLE_SM90,
// FUSEDATTN_BWD_SM80_TILE, ...) at every call and they are process-wide, so a test that left one
// set would silently move every later test in the binary onto another kernel.
#pragma once

#include <cctype>
#include <cstdlib>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fusedattn::testing {

// Sets `name` to `value` for the lifetime of the object, then puts back what was there: a value
// the run set from outside (tools/gpu_check.sh runs a step with FUSEDATTN_SM90_D64_TILE=192 set)
// holds for every later test, or none.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) before_ = before;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (before_)
      setenv(name_, before_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> before_;
};

// Switches as NAME, VALUE pairs.
using EnvSettings = std::vector<std::pair<const char*, const char*>>;

// A gtest name for settings (a parameterised test's instance): each NAME and VALUE without the
// FUSEDATTN_ prefix and without characters other than letters and digits, "defaults" for none.
inline std::string settings_test_name(const EnvSettings& settings) {
  std::string name;
  const auto append = [&name](const std::string& part) {
    for (const char ch : part)
      if (std::isalnum(static_cast<unsigned char>(ch))) name += ch;
  };
  for (const auto& [key, value] : settings) {
    const std::string k = key;
    const std::string prefix = "FUSEDATTN_";
    if (!name.empty()) name += '_';
    append(k.rfind(prefix, 0) == 0 ? k.substr(prefix.size()) : k);
    append(value);
  }
  return name.empty() ? "defaults" : name;
}

// Several switches set for one scope (a deque holds them: ScopedEnv does not move); label() is
// "NAME=VALUE ..." for a test's trace.
class ScopedEnvs {
 public:
  explicit ScopedEnvs(const EnvSettings& settings) {
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
