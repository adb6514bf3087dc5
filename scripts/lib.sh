# Shared by main.sh and test.sh: install what the build needs, configure build/, build.
# test_clang.sh takes only log and install_missing_tools; check_spills.sh and tools/sass_same.sh
# take sm90_instance_cubin. Sourced, not executed. Honours
# FUSEDATTN_CI=1 (set by .ci/run): a smaller CUDA instance set so a from-scratch build and test fits
# a 2-core CI runner.

FUSEDATTN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUSEDATTN_BUILD_DIR="${FUSEDATTN_ROOT}/build"

log() { echo "[fusedattn] $*" >&2; }

# Debian/Ubuntu packages for whatever is missing; nothing is installed when all is present.
# Optional arguments COMMAND=PACKAGE name further tools, each installed from PACKAGE when COMMAND
# is not on PATH (test_clang.sh: install_missing_tools clang++=clang).
install_missing_tools() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v g++ >/dev/null 2>&1 || missing+=(g++)
  command -v make >/dev/null 2>&1 || missing+=(make)
  [[ -f /usr/include/gtest/gtest.h ]] || missing+=(libgtest-dev)
  local tool
  for tool in "$@"; do
    command -v "${tool%%=*}" >/dev/null 2>&1 || missing+=("${tool#*=}")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    return
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing: ${missing[*]}; install them with your package manager (apt-get not found)"
    exit 1
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo)
  fi
  log "installing: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
}

# The CUDA backend is built when nvcc is on PATH or in the default toolkit location (which is
# then put on PATH so CMake finds it too).
cuda_option() {
  if command -v nvcc >/dev/null 2>&1; then
    echo ON
  else
    echo OFF
  fi
}

configure_and_build() {
  local target="${1:-all}"
  if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:${PATH}"
  fi
  local cuda
  cuda="$(cuda_option)"
  local args=(-DCMAKE_BUILD_TYPE=Release "-DFUSEDATTN_CUDA=${cuda}")
  if [[ "${FUSEDATTN_CI:-0}" == "1" ]]; then
    # One head dim, sm90 only: the same code paths as the default set at a fraction of the
    # compile time (each instance is one kernel in one translation unit).
    args+=(-DFUSEDATTN_HEAD_DIMS=64 -DFUSEDATTN_SM80_ARCHS=90)
  fi
  log "configuring ${FUSEDATTN_BUILD_DIR} (CUDA ${cuda}${FUSEDATTN_CI:+, CI=${FUSEDATTN_CI}})"
  cmake -S "${FUSEDATTN_ROOT}" -B "${FUSEDATTN_BUILD_DIR}" "${args[@]}"
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  log "building ${target} with ${jobs} jobs"
  cmake --build "${FUSEDATTN_BUILD_DIR}" --target "${target}" -j "${jobs}"
}

# One Hopper kernel instance (src/cuda/instances/<name>.cu of the source tree TREE) compiled alone
# to a cubin for sm_90a, as the spill check (check_spills.sh) and the SASS comparison
# (tools/sass_same.sh) both compile them; further arguments go to nvcc (e.g. -Xptxas=-v).
#   sm90_instance_cubin TREE NAME OUT.cubin [nvcc args...]
sm90_instance_cubin() {
  local tree=$1 name=$2 cubin=$3
  shift 3
  nvcc -I"${tree}/include" -I"${tree}/src" -O3 -DNDEBUG --expt-relaxed-constexpr \
    -gencode=arch=compute_90a,code=sm_90a -std=c++20 -x cu -cubin "$@" \
    "${tree}/src/cuda/instances/${name}.cu" -o "${cubin}"
}
