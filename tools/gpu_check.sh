#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, compute-sanitizer on a small set, the CLI, the
# Python tests, and the peer benchmark; a short table last. Logs are written to a scratch folder
# and packed into $OUT/logs.tgz (the device tool returns at most 8 files), with summary.txt and
# the peers' JSON lines beside it.
#   tools/gpu_check.sh [quick|full] [bench-suite]      e.g. tools/gpu_check.sh full fa
# quick: head dims 64;128 and the quick peer suite; full: every instance and the FA grid.
set -uo pipefail
mode=${1:-quick}
suite=${2:-$([ "$mode" = full ] && echo fa || echo quick)}
dest=${OUT:-$PWD/gpu_logs}
out=$(mktemp -d)
mkdir -p "$dest"
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-gpu
jobs=$(nproc)
summary=$out/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME LOGFILE CMD...: runs CMD, logs it, records pass/fail and wall time
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  "$@" > "$out/$log" 2>&1
  local rc=$?
  note "$(printf '%-28s %-5s %4ds  (%s)' "$name" "$([ $rc = 0 ] && echo ok || echo FAIL:$rc)" $((SECONDS - t0)) "$log")"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpu.txt"
heads="64;128"
[ "$mode" = full ] && heads="32;64;96;128;192;256"

step configure configure.log cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFUSEDATTN_HEAD_DIMS="$heads" -DFUSEDATTN_SM80_ARCHS=90 -DFUSEDATTN_BUILD_PYTHON=ON
step build build.log cmake --build "$build" -j "$jobs" || { tail -40 "$out/build.log"; exit 1; }
grep -E "spill|stack frame" "$out/build.log" | grep -vE " 0 bytes spill stores, 0 bytes spill loads|0 bytes stack frame" \
  | sort | uniq -c | head -20 > "$out/spills.txt"
note "spill/stack lines (non-zero): $(wc -l < "$out/spills.txt")"

step gpu-tests gpu_tests.log "$build/tests/fusedattn_gpu_tests" --gtest_brief=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$out/gpu_tests.log" | tail -15 | tee -a "$summary"
step cpu-tests cpu_tests.log "$build/tests/fusedattn_tests" --gtest_brief=1

san_filter=${SANITIZER_FILTER:-*Sanitizer*}
for tool in memcheck racecheck synccheck; do
  step "sanitizer-$tool" "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$build/tests/fusedattn_gpu_tests" --gtest_filter="$san_filter" --gtest_brief=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer_$tool.log" | tail -2 | tee -a "$summary"
done

step cli cli.log "$build/fusedattn" --backend cuda
tail -3 "$out/cli.log" | tee -a "$summary"

if [ -d "$build/python" ]; then
  export PYTHONPATH=$build/python:${PYTHONPATH:-}
  step pytest pytest.log python3 -m pytest -q -x "$root/tests/python"
  tail -3 "$out/pytest.log" | tee -a "$summary"
fi

peers=$root/.devbuild/carry/peers.py
if [ -f "$peers" ]; then
  for dt in float16 bfloat16; do
    step "peers-$suite-$dt" "peers_${suite}_$dt.log" env PYTHONUNBUFFERED=1 python3 "$peers" --suite "$suite" \
      --dtype "$dt" --providers sdpa_flash,sdpa_cudnn,ours --ours-module fusedattn --out "$out/peers_${suite}_$dt.jsonl"
    [ "$mode" = full ] || break
  done
fi

tar czf "$dest/logs.tgz" -C "$out" . && cp "$summary" "$dest/" && cp "$out"/peers_*.jsonl "$dest/" 2>/dev/null
echo; echo "==== summary ===="; cat "$summary"
for f in "$out"/peers_*.log; do [ -f "$f" ] && { echo "== $f"; sed -n '/^suite/,$p' "$f"; }; done
