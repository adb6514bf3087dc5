#!/usr/bin/env bash
# Builds and installs the fusedattn Python package (pip + scikit-build-core, against the installed
# torch) and runs its pytest suite. Installs what is missing first: scikit-build-core, ninja,
# pytest, transformers (for the integration test; that test skips without it) and, when torch is
# absent, torch itself (the CPU wheel where its index is reachable, else the PyPI wheel).
#
# Without a visible GPU the CUDA backend is left out of the build (-Ccmake.define.FUSEDATTN_CUDA=OFF):
# its kernels could not run here, and the CPU-only build takes about a minute on two cores.
# FUSEDATTN_CI=1 limits a GPU build to the CI instance set, like scripts/lib.sh does.
#   scripts/test_python.sh [extra pytest arguments]
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
log() { echo "[fusedattn/python] $*" >&2; }
has_module() { "${python}" -c "import $1" >/dev/null 2>&1; }
pip_install() { "${python}" -m pip install -q --disable-pip-version-check "$@"; }

start=${SECONDS}
if ! has_module torch; then
  log "torch is missing: installing the CPU wheel"
  pip_install torch --index-url https://download.pytorch.org/whl/cpu ||
    { log "the CPU wheel index is unreachable: installing torch from PyPI"; pip_install torch; }
fi
missing=()
has_module scikit_build_core || missing+=(scikit-build-core)
# scikit-build-core runs a ninja found on PATH; the PyPI package is only needed without one.
has_module ninja || command -v ninja >/dev/null || missing+=(ninja)
has_module pytest || missing+=(pytest)
has_module numpy || missing+=(numpy)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]}"
  pip_install "${missing[@]}"
fi
if ! has_module transformers; then
  pip_install transformers || log "transformers could not be installed: its integration test will skip"
fi
log "dependencies ready ($((SECONDS - start)) s)"

# Some machines report AMX in cpuid but do not let a process use it (this project's CI sandbox):
# there torch's bf16 matmul on the CPU (oneDNN's AMX kernels, torch 2.15 from PyPI) dies with
# SIGILL inside the tests' reference. Cap oneDNN at the AVX-512 kernels where that happens.
bf16_matmul="import torch; x = torch.ones(64, 64, dtype=torch.bfloat16); (x @ x).sum().item()"
# (The subshell, which does not exec python, reports the signal to /dev/null rather than the log.)
if [[ -z "${ONEDNN_MAX_CPU_ISA:-}" ]] && ! ("${python}" -c "${bf16_matmul}"; exit $?) >/dev/null 2>&1; then
  log "torch's bf16 matmul fails on this CPU: ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16"
  export ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16
fi

defines=()
if "${python}" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  log "a GPU is visible: building the CUDA backend too"
  if [[ "${FUSEDATTN_CI:-0}" == "1" ]]; then
    defines+=(-Ccmake.define.FUSEDATTN_HEAD_DIMS=64 -Ccmake.define.FUSEDATTN_SM80_ARCHS=90)
  fi
else
  log "no GPU visible: building the CPU backend only"
  defines+=(-Ccmake.define.FUSEDATTN_CUDA=OFF)
fi
build_start=${SECONDS}
# --no-build-isolation: the extension must be compiled against the torch installed here.
(cd "${root}" && "${python}" -m pip install -q --disable-pip-version-check --no-build-isolation "${defines[@]}" .)
log "package built and installed ($((SECONDS - build_start)) s)"

# Run from the tests' folder so that `import fusedattn` finds the installed package, not sources.
cd "${root}/tests/python"
"${python}" -m pytest -q -p no:cacheprovider "$@" .
log "total $((SECONDS - start)) s"
