// The on/off switches read from the environment (src/cuda/common/env.h), which every sm90 ablation
// switch and escape hatch parses: unset or empty leaves the default, '0...' is off, anything else
// on. Checked here without a GPU; the GPU tests then run each switch (Sm90Fwd.AblationSwitchesStayCorrect).
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>

#include "cuda/common/env.h"
#include "gpu/scoped_env.h"

namespace fusedattn::cuda {
namespace {

constexpr const char* kName = "FUSEDATTN_TEST_ENV_SWITCH";

TEST(EnvSwitch, UnsetOrEmptyKeepsTheDefault) {
  unsetenv(kName);
  EXPECT_EQ(env_switch(kName), std::nullopt);
  EXPECT_TRUE(env_switch_or(kName, true));
  EXPECT_FALSE(env_switch_or(kName, false));
  const testing::ScopedEnv empty(kName, "");
  EXPECT_EQ(env_switch(kName), std::nullopt);
  EXPECT_TRUE(env_switch_or(kName, true));
  EXPECT_FALSE(env_switch_or(kName, false));
}

TEST(EnvSwitch, ZeroTurnsItOffAnythingElseOn) {
  for (const char* off : {"0", "00", "0x"}) {
    const testing::ScopedEnv scoped(kName, off);
    EXPECT_EQ(env_switch(kName), std::optional<bool>(false)) << off;
    EXPECT_FALSE(env_switch_or(kName, true)) << off;
  }
  for (const char* on : {"1", "2", "yes", " 0"}) {
    const testing::ScopedEnv scoped(kName, on);
    EXPECT_EQ(env_switch(kName), std::optional<bool>(true)) << on;
    EXPECT_TRUE(env_switch_or(kName, false)) << on;
  }
}

// A switch set from outside the test binary holds again once a test's own setting ends.
TEST(EnvSwitch, ScopedSettingsPutBackTheValueBefore) {
  setenv(kName, "outside", 1);
  {
    const testing::ScopedEnv scoped(kName, "0");
    EXPECT_STREQ(std::getenv(kName), "0");
    {
      const testing::ScopedEnv nested(kName, "1");
      EXPECT_STREQ(std::getenv(kName), "1");
    }
    EXPECT_STREQ(std::getenv(kName), "0");
  }
  EXPECT_STREQ(std::getenv(kName), "outside");
  unsetenv(kName);
  { const testing::ScopedEnv scoped(kName, "1"); }
  EXPECT_EQ(std::getenv(kName), nullptr);
}

}  // namespace
}  // namespace fusedattn::cuda
