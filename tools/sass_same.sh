#!/usr/bin/env bash
# Whether kernel instances compile to the same machine code in the working tree as at another
# revision: a refactor that leaves every affected instance's SASS unchanged needs no GPU run to
# prove it (the code that would run is the code that ran). Compiles each named instance
# (src/cuda/instances/<name>.cu, sm_90a: scripts/lib.sh's sm90_instance_cubin, as check_spills.sh
# compiles them) in both trees and compares every SASS instruction line.
#   tools/sass_same.sh REV NAME [NAME ...]     e.g. tools/sass_same.sh main sm90_bwd_fp16_d64_full
# Prints per instance "same" or "DIFFERS" with both instruction counts; exits 1 if any differs.
# Every instruction line counts: a d256 forward kernel has ~8600, past address 0xffff, so a
# pattern for four-digit addresses alone would compare only its first 4096. Needs nvcc and
# cuobjdump (PATH, /usr/local/cuda/bin, or the one bundled with Triton's Python package).
set -uo pipefail
rev=${1:?usage: tools/sass_same.sh REV NAME [NAME ...]}
shift
[ $# -gt 0 ] || { echo "no instance names given (e.g. sm90_bwd_fp16_d64_full)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../scripts/lib.sh
source "$root/scripts/lib.sh"
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || { echo "nvcc not found" >&2; exit 2; }
cuobjdump=$(command -v cuobjdump || true)
if [ -z "$cuobjdump" ]; then
  triton=$(python3 -c 'import os, triton; print(os.path.dirname(triton.__file__))' 2>/dev/null || true)
  [ -n "$triton" ] && [ -x "$triton/backends/nvidia/bin/cuobjdump" ] && cuobjdump=$triton/backends/nvidia/bin/cuobjdump
fi
[ -n "$cuobjdump" ] || { echo "cuobjdump not found (PATH, /usr/local/cuda/bin, Triton's package)" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base"
git -C "$root" archive "$rev" | tar x -C "$work/base" || { echo "git archive $rev failed" >&2; exit 2; }

compile() {  # tree name tag
  sm90_instance_cubin "$1" "$2" "$work/$2.$3.cubin" > "$work/$2.$3.log" 2>&1
}
# The SASS instruction lines of a cubin, once, into a file beside it.
instructions() { "$cuobjdump" -sass "$1" | grep -E '^[[:space:]]+/\*[0-9a-f]+\*/' > "$1.sass"; }

status=0
for name in "$@"; do
  [ -f "$root/src/cuda/instances/$name.cu" ] || { echo "$name: no src/cuda/instances/$name.cu"; status=1; continue; }
  compile "$root" "$name" tree & compile "$work/base" "$name" base & wait
  for tag in tree base; do
    [ -s "$work/$name.$tag.cubin" ] || { echo "$name: the $tag build failed:"; tail -5 "$work/$name.$tag.log"; status=1; continue 2; }
  done
  instructions "$work/$name.tree.cubin"
  instructions "$work/$name.base.cubin"
  na=$(wc -l < "$work/$name.tree.cubin.sass") nb=$(wc -l < "$work/$name.base.cubin.sass")
  if cmp -s "$work/$name.tree.cubin.sass" "$work/$name.base.cubin.sass"; then
    echo "$name: same ($na instructions)"
  else
    echo "$name: DIFFERS (tree $na instructions, $rev $nb)"
    status=1
  fi
done
exit $status
