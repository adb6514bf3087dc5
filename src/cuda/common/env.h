// On/off switches read from the environment: A/B measurements and escape hatches. A switch is set
// when its variable is non-empty; a value starting with '0' turns it off, any other value on.
#pragma once

#include <cstdlib>
#include <optional>

namespace fusedattn::cuda {

// The switch's setting, or none when the variable is unset or empty.
inline std::optional<bool> env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  return v[0] != '0';
}

// The switch's setting, or `fallback` when it is not set.
inline bool env_switch_or(const char* name, bool fallback) { return env_switch(name).value_or(fallback); }

}  // namespace fusedattn::cuda
