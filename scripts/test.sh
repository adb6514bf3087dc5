#!/usr/bin/env bash
# Builds fusedattn with its tests and runs them all: the C++ suites through ctest (GPU tests skip
# when no GPU is visible), then the Python tests when scripts/test_python.sh is present.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing_tools
configure_and_build all
log "running ctest"
ctest --test-dir "${FUSEDATTN_BUILD_DIR}" --output-on-failure -j "$(nproc 2>/dev/null || echo 2)"

python_tests="${FUSEDATTN_ROOT}/scripts/test_python.sh"
if [[ -x "${python_tests}" ]]; then
  log "running the Python tests"
  "${python_tests}"
else
  log "scripts/test_python.sh not present: skipping the Python tests"
fi
