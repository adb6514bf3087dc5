#!/usr/bin/env bash
# Builds fusedattn (Release, CUDA when nvcc is available) and runs the CLI's default workload.
# Extra arguments go to the CLI, e.g. ./scripts/main.sh --backend cpu --causal --seqlen-q 4096
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

install_missing_tools
configure_and_build fusedattn_cli
exec "${FUSEDATTN_BUILD_DIR}/fusedattn" "$@"
