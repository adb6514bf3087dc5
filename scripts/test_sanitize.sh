#!/usr/bin/env bash
# Builds the CPU backend, the API, the CLI and the CPU tests with AddressSanitizer and
# UndefinedBehaviorSanitizer in build-sanitize/ (RelWithDebInfo, CUDA off) and runs ctest there:
# an out-of-bounds access, a use after free, a leak or undefined behaviour anywhere in a test
# (the API fuzz's thousands of malformed calls among them) aborts that test and fails the run.
# Run by .ci/run after the clang build.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing_tools
build_dir="${FUSEDATTN_ROOT}/build-sanitize"
jobs="$(nproc 2>/dev/null || echo 2)"

log "configuring ${build_dir} (address,undefined)"
cmake -S "${FUSEDATTN_ROOT}" -B "${build_dir}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSEDATTN_CUDA=OFF \
  -DFUSEDATTN_SANITIZE=address,undefined -DFUSEDATTN_BUILD_PYTHON=OFF -DFUSEDATTN_BUILD_TESTS=ON \
  -DFUSEDATTN_BUILD_CLI=ON
log "building all with ${jobs} jobs"
cmake --build "${build_dir}" --target all -j "${jobs}"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
log "running ctest (sanitized build)"
ctest --test-dir "${build_dir}" --output-on-failure -j "${jobs}"
