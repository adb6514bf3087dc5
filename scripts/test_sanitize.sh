#!/usr/bin/env bash
# Builds the CPU backend, the API, the CLI and the CPU tests under sanitizers (CUDA off,
# RelWithDebInfo) and runs ctest in each build: an out-of-bounds access, a use after free, a leak,
# undefined behaviour or a data race anywhere in a test (the API fuzz's thousands of malformed calls
# among them) aborts that test and fails the run. Run by .ci/run after the clang build.
#   build-sanitize/: AddressSanitizer and UndefinedBehaviorSanitizer, GCC (the AVX-512 objects too);
#                    then 1,000 random command lines of its CLI (tests/cli/fuzz_cli.py).
#   build-tsan/:     ThreadSanitizer (the CPU backend's worker threads), clang: GCC's build crashes
#                    at load, in the ifunc resolvers of the hot functions' target clones (simd.h),
#                    which run before the TSan runtime is set up; clang builds no clones.
#   build-sanitize/python: the PyTorch binding (CPU backend) under ASan and UBSan, and the Python
#                    tests run with it, the sanitizer runtimes preloaded into python; where torch and
#                    pytest are importable (scripts/test_python.sh, run before by test.sh, installs
#                    them), else skipped with a note.
# Installs clang (Debian package clang) when clang++ is missing.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing_tools clang++=clang
jobs="$(nproc 2>/dev/null || echo 2)"

# sanitized_build DIR SANITIZERS CC CXX: configure, build and run ctest in DIR.
sanitized_build() {
  local dir="${FUSEDATTN_ROOT}/$1" sanitizers="$2"
  log "configuring ${dir} (${sanitizers}, $("$4" --version | sed -n 1p))"
  CC="$3" CXX="$4" cmake -S "${FUSEDATTN_ROOT}" -B "${dir}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFUSEDATTN_CUDA=OFF -DFUSEDATTN_SANITIZE="${sanitizers}" -DFUSEDATTN_BUILD_PYTHON=OFF \
    -DFUSEDATTN_BUILD_TESTS=ON -DFUSEDATTN_BUILD_CLI=ON
  log "building all with ${jobs} jobs"
  cmake --build "${dir}" --target all -j "${jobs}"
  log "running ctest (${sanitizers})"
  ctest --test-dir "${dir}" --output-on-failure -j "${jobs}"
}

# The Python tests against the binding built with ASan and UBSan into build-sanitize/python. python
# itself is not instrumented, so the runtimes are preloaded, and leaks are not reported (the
# interpreter's own allocations at exit would be).
sanitized_python() {
  local python="${PYTHON:-python3}" target="${FUSEDATTN_ROOT}/build-sanitize/python"
  if ! "${python}" -c "import torch, pytest, scikit_build_core" >/dev/null 2>&1; then
    log "torch, pytest or scikit-build-core missing: skipping the sanitized Python tests"
    return
  fi
  log "building the Python binding (address,undefined, CPU backend) into ${target}"
  rm -rf "${target}"
  (cd "${FUSEDATTN_ROOT}" && PIP_ROOT_USER_ACTION=ignore "${python}" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --target "${target}" -Ccmake.define.FUSEDATTN_CUDA=OFF \
    -Ccmake.define.FUSEDATTN_SANITIZE=address,undefined -Cbuild-dir="${FUSEDATTN_ROOT}/build-sanitize/skbuild" .)
  log "running the Python tests (address,undefined)"
  (cd "${FUSEDATTN_ROOT}/tests/python" &&
    LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libubsan.so)" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" PYTHONPATH="${target}" \
    "${python}" -m pytest -q -p no:cacheprovider .)
}

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1"
sanitized_build build-sanitize address,undefined gcc g++
log "random command lines of the CLI (address,undefined)"
python3 "${FUSEDATTN_ROOT}/tests/cli/fuzz_cli.py" "${FUSEDATTN_ROOT}/build-sanitize/fusedattn" --runs 1000
sanitized_build build-tsan thread clang clang++
sanitized_python
