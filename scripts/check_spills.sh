#!/usr/bin/env bash
# Compiles every Hopper (sm90a) forward kernel instance (src/cuda/instances/sm90_*.cu: all head
# dims, dtypes, masks and CTA pairs, not only the ones a build selects) to a cubin with ptxas -v,
# and fails if any kernel spills registers. The project keeps these kernels at 0 B of spills; a
# spill in one instance shows only in a build of its head dim (d256's unpaired tiles spilled
# 400-436 B for five sessions unnoticed, docs/perf.md fifty-fourth session), and CI builds d64
# only. Run by .ci/run; skipped (not failed) where nvcc is missing. About a minute on 2 cores.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:${PATH}"
fi
if ! command -v nvcc >/dev/null 2>&1; then
  log "check_spills: nvcc not found, skipping the spill check of the sm90 instances"
  exit 0
fi

out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT
compile_one() {  # instance file -> its ptxas report in ${out}
  local src=$1 name
  name="$(basename "${src}" .cu)"
  sm90_instance_cubin "${FUSEDATTN_ROOT}" "${name}" "${out}/${name}.cubin" -Xptxas=-v \
    > "${out}/${name}.log" 2>&1 || { echo "compile failed: ${name}" >> "${out}/failed"; }
}
export -f compile_one sm90_instance_cubin
export out FUSEDATTN_ROOT
instances=("${FUSEDATTN_ROOT}"/src/cuda/instances/sm90_*.cu)
log "check_spills: compiling ${#instances[@]} sm90 instances with ptxas -v"
printf '%s\n' "${instances[@]}" | xargs -P "$(nproc 2>/dev/null || echo 2)" -I{} bash -c 'compile_one "$@"' _ {}

if [[ -f "${out}/failed" ]]; then
  cat "${out}/failed" >&2
  for f in $(sed 's/compile failed: //' "${out}/failed"); do tail -20 "${out}/${f}.log" >&2; done
  exit 1
fi
# ptxas prints the entry it compiles, then its frame and spill line: report each kernel that spills.
spilled=$(awk '/Compiling entry function/ { entry = $0 }
               /bytes spill stores/ && !/ 0 bytes spill stores, 0 bytes spill loads/ {
                 print FILENAME ": " $0; print "    in " entry }' "${out}"/*.log)
if [[ -n "${spilled}" ]]; then
  log "check_spills: kernels that spill registers:"
  echo "${spilled}" >&2
  exit 1
fi
log "check_spills: no sm90 kernel spills (${#instances[@]} instances)"
