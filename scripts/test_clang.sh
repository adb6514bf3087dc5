#!/usr/bin/env bash
# Builds the CPU backend with clang in build-clang/ (Release, CUDA and the Python binding off: the
# library, the fusedattn CLI and the CPU tests) and runs ctest there, then the CLI once on a small
# backward as a smoke test. Run by .ci/run after test.sh, so code that GCC takes and clang refuses
# (e.g. clang 14 and a lambda capturing a structured binding) fails CI too. Installs clang (Debian
# package clang) when clang++ is missing. This build has no AVX-512 objects (GCC only,
# CMakeLists.txt), hence fewer tests than build/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing_tools clang++=clang
build_dir="${FUSEDATTN_ROOT}/build-clang"
jobs="$(nproc 2>/dev/null || echo 2)"

log "configuring ${build_dir} with $(clang++ --version | sed -n 1p)"
CC=clang CXX=clang++ cmake -S "${FUSEDATTN_ROOT}" -B "${build_dir}" -DCMAKE_BUILD_TYPE=Release \
  -DFUSEDATTN_CUDA=OFF -DFUSEDATTN_BUILD_PYTHON=OFF -DFUSEDATTN_BUILD_TESTS=ON \
  -DFUSEDATTN_BUILD_CLI=ON
log "building all with ${jobs} jobs"
cmake --build "${build_dir}" --target all -j "${jobs}"

log "running ctest (clang build)"
ctest --test-dir "${build_dir}" --output-on-failure -j "${jobs}"

# Smoke test of the main job: one small checked backward (forward then backward, sampled rows
# against float64), under a second.
log "running the CLI (clang build)"
"${build_dir}/fusedattn" --backend cpu --backward --batch 1 --heads 4 --seqlen-q 256 --head-dim 64 \
  --iters 2 --warmup 1
