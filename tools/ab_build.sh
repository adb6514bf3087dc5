#!/usr/bin/env bash
# A/B of a compile-time switch on the GPU machine, in one call of about a minute: two CLI-only
# builds of the listed head dims side by side, one with -D<SWITCH>=1 and one with -D<SWITCH>=0
# (AB_VALUES="A B" sets the two values, e.g. "64 128" for a threshold), then the CLI's timed runs
# of each point, the two builds alternating, REPEAT rounds.
#   tools/ab_build.sh SWITCH d:mask:seqlen [d:mask:seqlen ...]
#     mask: full or causal; the FA grid's shape (16k tokens, model dim 2048), or any shape as
#     d:mask:sq:sk:batch:hq:hkv (fa_point.sh, point_args; e.g. 128:full:1:4096:1:32:8, a decode
#     step); fp16 unless AB_DTYPE=bf16. AB_HEADS="64;128" (default: the head dims of the points) is the build's
#     FUSEDATTN_HEAD_DIMS. REPEAT (default 3) rounds. AB_CLI_ARGS adds CLI arguments to every run
#     (`--backward` times the backward).
# Each line: round, point, which build, the CLI's TFLOP/s and time (median of its 20 timed runs) and its
# check against float64 (16 sampled rows; a failed check exits 3, shown as rc). The builds go to
# build-ab<value>/, logs to $OUT (the runs also to ab_runs_<SWITCH>.txt); last, per point, the
# ratio of the two builds' speeds (by time) in each round and its median. Runtime switches (environment
# variables) need no second build: gpu_check.sh's POINT_ENVS compares them.
set -uo pipefail
switch=${1:?usage: tools/ab_build.sh SWITCH d:mask:seqlen ...}
shift
[ $# -gt 0 ] || { echo "no points given" >&2; exit 2; }
dest=${OUT:-$PWD/gpu_logs}
mkdir -p "$dest"
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=fa_point.sh
source "$root/tools/fa_point.sh"
heads=${AB_HEADS:-$(for p in "$@"; do echo "${p%%:*}"; done | sort -un | paste -sd';')}
dtype=${AB_DTYPE:-fp16}
jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
read -r -a values <<< "${AB_VALUES:-1 0}"
[ ${#values[@]} -eq 2 ] || { echo "AB_VALUES needs two values, got '${AB_VALUES:-}'" >&2; exit 2; }
runs=$dest/ab_runs_$switch.txt
: > "$runs"
# AB_SM90=OFF leaves the Hopper kernels out of both builds (an A/B of the portable kernels, whose
# builds then take about half the time).
config=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFUSEDATTN_CUDA=ON -DFUSEDATTN_SM90="${AB_SM90:-ON}" -DFUSEDATTN_FULL=OFF
        -DFUSEDATTN_HEAD_DIMS="$heads" -DFUSEDATTN_SM80_ARCHS=90 -DFUSEDATTN_BUILD_TESTS=OFF
        -DFUSEDATTN_BUILD_CLI=ON -DFUSEDATTN_BUILD_PYTHON=OFF -DFUSEDATTN_SM90_TRACE=OFF)
# AB_BASE_SOURCE=dir builds the second value from another source tree (e.g. main's, unpacked from
# `git archive`), so a branch's kernels can be timed against main's with the same switch unused.
source_of() { [ "$1" = "${values[1]}" ] && [ -n "${AB_BASE_SOURCE:-}" ] && echo "$AB_BASE_SOURCE" || echo "$root"; }
for v in "${values[@]}"; do
  drop_foreign_build "$root/build-ab$v" "$(source_of "$v")"
  (cmake -S "$(source_of "$v")" -B "$root/build-ab$v" "${config[@]}" -DCMAKE_CUDA_FLAGS="-D$switch=$v" > "$dest/ab_configure$v.log" 2>&1 &&
     cmake --build "$root/build-ab$v" -j "$jobs" --target fusedattn_cli > "$dest/ab_build$v.log" 2>&1
   echo "build $switch=$v: rc $?") &
done
wait
for v in "${values[@]}"; do
  echo "build $switch=$v, ptxas lines with spills: $(grep -cE '[1-9][0-9]* bytes spill' "$dest/ab_build$v.log")," \
    "serialising wgmma: $(grep -cE '\(C751[0-9]\)' "$dest/ab_build$v.log")"
done
for round in $(seq "${REPEAT:-3}"); do
  for point in "$@"; do
    IFS=: read -r d mask s <<< "$point"
    shape=$(point_args "$point") || { echo "point $point: D:MASK:SEQLEN or D:MASK:SQ:SK:BATCH:HQ:HKV, mask full or causal"; continue; }
    for v in "${values[@]}"; do
      # shellcheck disable=SC2086  # $shape is a list of CLI arguments
      result=$("$root/build-ab$v/fusedattn" --backend cuda $shape --dtype "$dtype" --warmup 3 --iters 20 \
        --check-rows 16 ${AB_CLI_ARGS:-} 2>&1)
      rc=$?
      echo "$round d$d $mask $s $switch=$v $(grep -o 'tflops=[0-9.]*' <<< "$result") $(grep -o 'time_ms=[0-9.]*' <<< "$result") rc=$rc" |
        tee -a "$runs"
    done
  done
done
# Per point: the first value's speed over the second's in each round (the second's time over the
# first's: the CLI prints TFLOP/s to three decimals, too few for a decode step's ~0.002), and
# their median.
python3 - "$runs" "$switch=${values[0]}" "$switch=${values[1]}" <<'PY'
import statistics, sys
path, first, second = sys.argv[1:]
times, points, rounds = {}, [], []
for line in open(path):
    rnd, d, mask, s, build = line.split()[:5]
    point = f"{d} {mask} {s}"
    points += [point] if point not in points else []
    rounds += [rnd] if rnd not in rounds else []
    for field in line.split()[5:]:
        if field.startswith("time_ms="):
            times[rnd, point, build] = float(field.split("=")[1])
print(f"speed ratios {first} / {second}, per round, then the median:")
for point in points:
    ratios = [times[r, point, second] / times[r, point, first] for r in rounds
              if times.get((r, point, first)) and (r, point, second) in times]
    median = f"{statistics.median(ratios):.3f}" if ratios else "-"
    print(point, " ".join(f"{x:.3f}" for x in ratios), " median", median)
PY
