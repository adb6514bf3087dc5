#!/usr/bin/env bash
# The GPU machine's one script: build, GPU tests, compute-sanitizer on a small set, the CLI, the
# Python tests and the peer benchmark, with a short table last.
#   tools/gpu_check.sh [quick|sm90|full] [steps]
#     quick: head dims 64;128;   sm90: the Hopper kernel's (CMakeLists.txt's FUSEDATTN_SM90_HEAD_DIMS);
#     full: every instance (32..256)
#            (GPU_HEAD_DIMS="192;256" overrides the mode's list, for a shorter build)
#     steps: comma list of build,tests,sanitize,cli,pytest,peers   (default: build,tests,cli,peers,
#            what one call fits; sanitize and pytest each want a call of their own, see below), and
#            trace (not in the default: the Hopper forward's tile-boundary trace build, run at
#            TRACE_POINTS, head_dim:seqlen[:causal] of the FA grid (full mask unless :causal),
#            default 256:2048,256:16384,128:2048; docs/hopper.md, "Tracing a tile boundary"), and
#            points (not in the default: tools/bench_points.py at POINTS with the providers
#            POINT_PROVIDERS, default sdpa_flash,sdpa_cudnn,ours, one more column per setting in
#            POINT_ENVS (space-separated NAME=VALUE[+NAME=VALUE]), POINT_REPEAT readings each, the
#            column order reversed every second time unless POINT_ORDER=given; POINT_DTYPE, default
#            float16, may list several, float16,bfloat16: a run each; POINT_CLOCKS=1 adds each
#            reading's mean SM clock, power and temperature to its JSON line), and
#            power (not in the default: tools/bench_power.py's sustained TFLOP/s, SM clock and board
#            power, calls back to back for POWER_SECONDS (default 2) a run, at POWER_POINTS (forward
#            points as in POINTS; fa-fwd, the whole forward grid, wants POWER_SECONDS=1 to fit the
#            step's 400 s, ~330 s on an H100: one dtype a call) with the providers POWER_PROVIDERS,
#            default sdpa_cudnn,ours, and an ours column per setting in POWER_ENVS, as POINT_ENVS, a
#            run per dtype in POWER_DTYPE, default POINT_DTYPE, as POINT_DTYPE), and
#            span (not in the default: tools/call_span.py, a short loop of calls below the power
#            cap, at SPAN_POINTS (forward points as in POINTS, default fwd:256:full:2048) with the
#            providers SPAN_PROVIDERS,
#            default sdpa_cudnn,ours, an ours column per setting in SPAN_ENVS, a run per dtype in
#            SPAN_DTYPE, default float16,bfloat16), and
#            chain (not in the default: tools/chain_bench.py, each attention call right behind a
#            copy that writes its query, many in a row, at CHAIN_POINTS (forward points as in
#            POINTS, default decode) with the providers CHAIN_PROVIDERS, default sdpa_cudnn,ours,
#            an ours column per setting in CHAIN_ENVS, as POINT_ENVS, in POINT_DTYPE's first dtype;
#            CHAIN_MODES, default "runs", may add "graph": the pairs captured into a CUDA graph, and
#            "runs-cold" / "graph-cold": each pair after a write of CHAIN_COLD_MIB (default 128) MiB
#            that takes K/V out of the L2, as a model's other layers would)
# The GPU tests run as GPU_TEST_SHARDS (default 6) gtest shards in parallel, GPU_TEST_FILTER (a
# gtest filter, default all; a parameterised suite's names start with its prefix, so
# "*Sm90Shapes*", not "Sm90Shapes*") picks some; SANITIZE_FILTER replaces the sanitizer steps' set
# (a gtest filter, or `sm90`: the Hopper forward's part of the set alone, ~220 s for the three
# tools; the whole set with its backward rows and the 192-row d64 runs takes longer, up to the
# steps' 900 s of limits, so run it in a call of its own).
# GPU_TEST_LIMIT (seconds, default 540) bounds each shard, so a hang costs less than the call; the
# summary names the test a shard was in when its limit cut it off.
# SMOKE_TEST (a gtest filter, e.g. one case of a new kernel) runs first, alone, under SMOKE_LIMIT
# seconds (default 30); if it fails or hangs, every step that launches our kernels (tests,
# sanitize, pytest, points, peers) is left out: they would hang too (session 60 lost a call to a
# kernel that hung on every launch).
# PEER_REPEAT=n runs each peers.py run n times into the same JSON lines (default 1; ~55 s per FA
# forward+backward run of one dtype); tools/perf_table.py then shows per-point medians.
# PEER_ORDER=balanced runs the even repeats with ours before cuDNN (peers.py runs a point's
# providers in the order given, and FA2's turn cools the card for whichever comes next: 1-5% at
# the power-capped points, docs/hopper.md session 72); the summary adds each order's table.
# GPU_CUDA_FLAGS adds nvcc flags to the main build, e.g. a compile-time experiment switch
# (-DFUSEDATTN_SM90_ASCENDING_MASKED=2) for its tests; unset, the build has none.
# PYTEST_K picks Python tests by pytest's -k expression (default all); PYTEST_LIMIT bounds the step
# (seconds, default 420: the whole suite on CUDA took ~240 s in session 54, ~315 s in session 100).
# The steps run in the order build, tests, sanitize, cli, pytest: sanitize (~260 s for its Hopper
# set) and pytest together overrun a call's 600 s with the machine's start, so give each a call.
# CPU_TESTS=0 leaves the CPU suite out of the tests step (~45 s; CI runs it on every change).
# GPU_REQUIRE (a part of the card's name, e.g. H200) stops the call before the build on any card
# whose name lacks it.
# The build folder (build-gpu/) is reused when it is there, so a second call on a warm machine
# can run the peers alone. Logs are packed into $OUT/logs-<steps>.tgz (the device tool returns at
# most 8 files), with summary.txt and the peers' JSON lines beside it. peers.py is read from
# .devbuild/carry/ (copied there from ../shared/bench, carried with the call).
set -uo pipefail
mode=${1:-quick}
steps=${2:-build,tests,cli,peers}
has() { [[ ",$steps," == *",$1,"* ]]; }
# Refused before anything runs, so that the call is not spent: the two steps together need ~575 s
# with the machine's start, one call's limit is 600 s, and a cut-off call returns no packed logs
# (session 100 lost one). GPU_CHECK_NO_CALL_LIMIT=1 runs them anyway, where no such limit applies.
if has sanitize && has pytest && [ "${GPU_CHECK_NO_CALL_LIMIT:-0}" != 1 ]; then
  echo "gpu_check: steps '$steps' has both sanitize and pytest, which overrun one device call;" \
       "run them in separate calls (or set GPU_CHECK_NO_CALL_LIMIT=1 where no call limit applies)" >&2
  exit 2
fi
dest=${OUT:-$PWD/gpu_logs}
out=$(mktemp -d)
mkdir -p "$dest"
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=fa_point.sh
source "$root/tools/fa_point.sh"
build=$root/build-gpu
summary=$out/summary.txt
: > "$summary"
# Each line also lands in $dest/summary-partial.txt at once, so a call cut short by the device's
# time limit still returns what finished (the packed logs are written only at the end).
note() { echo "$*" | tee -a "$summary"; cp "$summary" "$dest/summary-partial.txt"; }
# ptxas_spills LOG: the ptxas -v lines of LOG with a non-zero spill or stack frame, each after
# its kernel's "Compiling entry" line (every spill is a defect to track).
ptxas_spills() { grep -B3 -E "[1-9][0-9]* bytes (spill|stack)" "$1" | grep -E "Compiling entry|spill|stack"; }
# step NAME LIMIT_S LOG CMD...: runs CMD under a time limit, logs it, records result and wall time.
step() {
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$log" 2>&1
  local rc=$?
  record "$name" $rc $t0 "$log"
  return $rc
}
# record NAME RC T0 LOG: a step's line in the summary.
record() {
  note "$(printf '%-30s %-8s %4ds  (%s)' "$1" "$([ "$2" = 0 ] && echo ok || echo FAIL:$2)" $((SECONDS - $3)) "$4")"
}
# The GPU suite in GPU_TEST_SHARDS parallel processes (gtest sharding, default 6): its float64
# references run on the host, one core per process, so on the 16-core GPU machine the suite takes
# 224 s as six shards against ~790 s as one process (H200, docs/perf.md, twenty-fifth session).
gpu_tests_sharded() {
  local shards=${GPU_TEST_SHARDS:-6} limit=$1 t0=$SECONDS rc=0 pids=() i
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$limit" "$build/tests/fusedattn_gpu_tests" \
      --gtest_filter="${GPU_TEST_FILTER:-*}" --gtest_output="xml:$out/gpu_tests_$i.xml" \
      > "$out/gpu_tests_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  cat "$out"/gpu_tests_[0-9]*.log > "$out/gpu_tests.log"
  record gpu-tests $rc $t0 "gpu_tests.log, $shards shards"
  # A shard its time limit cut off writes no summary: name the test it was in (session 62 had to
  # rerun a whole call's tests to find out).
  for ((i = 0; i < shards; ++i)); do
    grep -qE '^\[==========\] [0-9]+ tests? from .* ran\.' "$out/gpu_tests_$i.log" ||
      note "shard $i cut off in: $(grep '^\[ RUN      \]' "$out/gpu_tests_$i.log" | tail -n 1 | cut -c 14-)"
  done
  # The slowest tests (gtest's XML reports), to balance the shards by.
  note "slowest: $(python3 - "$out" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
cases = []
for path in glob.glob(sys.argv[1] + "/gpu_tests_*.xml"):
    try:
        cases += [(float(c.get("time", 0)), c.get("classname") + "." + c.get("name"))
                  for c in ET.parse(path).iter("testcase")]
    except ET.ParseError:
        pass  # a shard cut off by its time limit writes no report
print(", ".join(f"{name} {t:.0f} s" for t, name in sorted(cases, reverse=True)[:6]))
PY
)"
  return $rc
}

gpu_info=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader)
echo "$gpu_info" | tee -a "$summary"
# A call meant for one kind of card (the pool may answer a request for an H200 with an H100) stops
# here, before the build, on any other: only the machine's start is spent. The name is the first
# card's first field.
gpu_name=${gpu_info%%,*}
if [ -n "${GPU_REQUIRE:-}" ] && [[ "$gpu_name" != *"$GPU_REQUIRE"* ]]; then
  note "GPU_REQUIRE=$GPU_REQUIRE: this card is '$gpu_name'; nothing run"
  exit 0
fi
heads="64;128"
[ "$mode" = full ] && heads="32;64;96;128;192;256"
# The sm90 mode builds every head dim the Hopper forward has an instance for, read from
# CMakeLists.txt's FUSEDATTN_SM90_HEAD_DIMS so a new instance is never left out of the GPU runs
# (the twenty-seventh session's d96 instance was: its tests ran on the d128 instance).
[ "$mode" = sm90 ] && heads=$(sed -n 's/^set(FUSEDATTN_SM90_HEAD_DIMS \(.*\))$/\1/p' "$root/CMakeLists.txt" | tr ' ' ';')
[ -n "$heads" ] || { echo "gpu_check: no FUSEDATTN_SM90_HEAD_DIMS in CMakeLists.txt" >&2; exit 2; }
heads=${GPU_HEAD_DIMS:-$heads}

# Configure options both builds share (the trace build's are these plus its own).
config=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFUSEDATTN_CUDA=ON -DFUSEDATTN_SM90=ON -DFUSEDATTN_FULL=OFF
        -DFUSEDATTN_HEAD_DIMS="$heads" -DFUSEDATTN_SM80_ARCHS=90 -DCMAKE_CUDA_FLAGS="${GPU_CUDA_FLAGS:-}")
# The steps that run the main build's binaries (trace has a build of its own).
uses_build() { has tests || has sanitize || has cli || has pytest || has peers || has points || has power || has span || has chain; }
if has build || { uses_build && [ ! -x "$build/tests/fusedattn_gpu_tests" ]; }; then
  # Every option named: a build folder left by an earlier call with other settings (the machine is
  # shared by every call of a session) must not change what this one builds.
  step configure 120 configure.log cmake -S "$root" -B "$build" "${config[@]}" \
    -DFUSEDATTN_BUILD_TESTS=ON -DFUSEDATTN_BUILD_CLI=ON -DFUSEDATTN_BUILD_PYTHON=ON -DFUSEDATTN_SM90_TRACE=OFF
  step build 480 build.log cmake --build "$build" -j "$(nproc)" || { tail -40 "$out/build.log"; }
  ptxas_spills "$out/build.log" > "$out/spills.txt"
  note "ptxas lines reporting spills or stack: $(grep -cE '[1-9][0-9]* bytes spill' "$out/spills.txt")"
  # wgmma serialised by ptxas (C7510-C7519, an "info" line, not a warning): a kernel that builds
  # and passes its tests yet runs at a fraction of its speed (docs/hopper.md, session 46).
  grep -E "\(C751[0-9]\)" "$out/build.log" > "$out/wgmma_serialised.txt"
  note "ptxas lines serialising wgmma: $(grep -c . "$out/wgmma_serialised.txt")"
fi

if [ -n "${SMOKE_TEST:-}" ]; then
  if ! step smoke "${SMOKE_LIMIT:-30}" smoke.log "$build/tests/fusedattn_gpu_tests" --gtest_filter="$SMOKE_TEST"; then
    note "smoke test failed or hung: tests, sanitize, pytest, points, span and peers left out"
    tail -n 20 "$out/smoke.log"
    steps=$(echo ",$steps," | sed 's/,tests,/,/; s/,sanitize,/,/; s/,pytest,/,/; s/,points,/,/; s/,span,/,/; s/,peers,/,/; s/^,//; s/,$//')
  fi
fi

if has tests; then
  gpu_tests_sharded "${GPU_TEST_LIMIT:-540}"
  grep -E "^\[  (PASSED  |SKIPPED )\] [0-9]+ tests?|^\[  FAILED  \]" "$out/gpu_tests.log" | tail -25 | tee -a "$summary"
  if [ "${CPU_TESTS:-1}" != 0 ]; then
    step cpu-tests 200 cpu_tests.log "$build/tests/fusedattn_tests" --gtest_brief=1
    grep -E " tests? ran|PASSED|FAILED" "$out/cpu_tests.log" | tail -5 | tee -a "$summary"
  fi
fi

if has sanitize; then
  # The Hopper forward's part (SANITIZE_FILTER=sm90 runs it alone): the tail-split paths (parts,
  # tickets, the combine) on small launches that split, the GQA-packed tiles (the grouped Q/O maps,
  # rows mapped to head and position) and variable-length batches (sequence scan, row-by-row stores
  # at sequence ends).
  sm90_set="GpuSanitizer.*:Sm90TailSplit.BitIdenticalOverThreeRuns:Sm90TailSplit.AlternatingShapesShareTheWorkspace"
  sm90_set="$sm90_set:Sm90Fwd.PackedGqaGroups:Sm90Varlen.RowsPastTheLastSequenceAreNeverTouched"
  # The backward's: its split, and the d192/d256 rows (column warps, dS fragments kept over the dQ
  # passes), both tiles.
  bwd_set="*BackwardSplit.Head64*:*Sm80Backward.WideHeadCausalGqa*:*Sm80Backward.WideHeadSm80Tiles*:*Sm80Backward.Head192*"
  [ "${SANITIZE_FILTER:-}" = sm90 ] && SANITIZE_FILTER=$sm90_set
  for tool in memcheck racecheck synccheck; do
    step "sanitizer-$tool" 200 "sanitizer_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$build/tests/fusedattn_gpu_tests" --gtest_filter="${SANITIZE_FILTER:-*Sanitizer*:$sm90_set:$bwd_set}" --gtest_brief=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|tests? ran" "$out/sanitizer_$tool.log" | tail -3 | tee -a "$summary"
  done
  # The small shapes above take d64's 128-row Hopper tile; the 192-row one (long queries) forced.
  [ -n "${SANITIZE_FILTER:-}" ] || for tool in memcheck racecheck; do
    step "sanitizer-$tool-d64-192" 150 "sanitizer_${tool}_d64_192.log" env FUSEDATTN_SM90_D64_TILE=192 \
      compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/fusedattn_gpu_tests" \
      --gtest_filter="*Sanitizer*:Sm90Fwd.FullyMaskedRows:Sm90Fwd.NanStaysInItsRow" --gtest_brief=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer_${tool}_d64_192.log" | tail -1 | tee -a "$summary"
  done
fi

if has cli; then
  step cli 120 cli.log "$build/fusedattn" --backend cuda
  step cli-bwd 120 cli_bwd.log "$build/fusedattn" --backend cuda --backward --causal --dtype bf16
  # Packed documents (a column mask), forward and backward, checked against float64 on sampled rows.
  step cli-docs 120 cli_docs.log "$build/fusedattn" --backend cuda --backward --causal --heads 8 --head-dim 128 \
    --documents 1500,7,700,841
  # A scale of the caller's: logits in the tens (fp16 forward), and a negative scale (bf16 backward).
  step cli-scale 120 cli_scale.log "$build/fusedattn" --backend cuda --softmax-scale 2 --seqlen-q 2048
  step cli-scale-bwd 120 cli_scale_bwd.log "$build/fusedattn" --backend cuda --backward --dtype bf16 \
    --softmax-scale -0.3 --seqlen-q 2048
  tail -n 2 "$out/cli.log" "$out/cli_bwd.log" "$out/cli_docs.log" "$out/cli_scale.log" "$out/cli_scale_bwd.log" |
    tee -a "$summary"
fi

export PYTHONPATH=$build/python:$root/.devbuild/carry:${PYTHONPATH:-}
if has pytest; then
  # -v: a step stopped at its limit names the test it was in (session 61's quiet log did not).
  step pytest "${PYTEST_LIMIT:-420}" pytest.log python3 -m pytest -v -x --durations=10 "$root/tests/python" \
    ${PYTEST_K:+-k "$PYTEST_K"}
  grep -E "^(FAILED|ERROR)" "$out/pytest.log" | tail -n 5 | tee -a "$summary"
  tail -n 2 "$out/pytest.log" | tee -a "$summary"
fi

peers=$root/.devbuild/carry/peers.py
# peer runs: "dtype" (the whole grid, every provider), "dtype-sm80" (the portable forward alone
# against FA2, for issue 3: the backward is the portable kernel in every run, so it is not repeated)
# "decode" (peers.py's decode suite, fp16, every provider), "decode-varlen" (tools/bench_varlen.py
# --decode at DECODE_BATCHES and DECODE_HEAD_DIMS (default 128): ragged caches, packed and through
# flash_attn_with_kvcache) or
# "varlen" (tools/bench_varlen.py, packed batches against FA2's and cuDNN's varlen kernels, fp16
# and bf16), "documents" (tools/bench_documents.py, packed causal documents under a column mask
# against the same documents as a varlen batch, fp16, forward and forward + backward, at
# DOCUMENT_HEAD_DIMS, default 64,128; DOCUMENT_DISTS and DOCUMENT_PROVIDERS pick its cases and
# columns, default all of bench_varlen's distributions and every column; DOCUMENT_KERNELS=1 adds
# each column's device time per kernel);
# their JSON lines go straight to $dest so a call cut short still returns what was measured.
peer_runs=${PEER_RUNS:-float16,float16-sm80,bfloat16}
if has peers && [ -f "$peers" ]; then
  suite=$([ "$mode" = quick ] && echo quick || echo fa)
  for run in ${peer_runs//,/ }; do
    dt=${run%-sm80}
    if [ "$run" = varlen ]; then
      for vdt in float16 bfloat16; do
        step "varlen-$vdt" 250 "varlen_$vdt.log" env PYTHONUNBUFFERED=1 python3 "$root/tools/bench_varlen.py" \
          --dtype "$vdt" --out "$dest/varlen_$vdt.jsonl"
      done
    elif [ "$run" = documents ]; then
      for pass in forward backward; do
        step "documents-$pass" 250 "documents_$pass.log" env PYTHONUNBUFFERED=1 python3 "$root/tools/bench_documents.py" \
          --head-dims "${DOCUMENT_HEAD_DIMS:-64,128}" $([ $pass = backward ] && echo --backward) \
          ${DOCUMENT_DISTS:+--dists "$DOCUMENT_DISTS"} ${DOCUMENT_PROVIDERS:+--providers "$DOCUMENT_PROVIDERS"} ${DOCUMENT_KERNELS:+--kernels} \
          --out "$dest/documents_$pass.jsonl"
      done
    elif [ "$run" = decode-varlen ]; then
      step decode-varlen 200 decode_varlen.log env PYTHONUNBUFFERED=1 python3 "$root/tools/bench_varlen.py" \
        --decode "${DECODE_BATCHES:-1,4,8,16,32,64}" --decode-head-dims "${DECODE_HEAD_DIMS:-128}" --out "$dest/decode_varlen.jsonl"
    elif [ "$run" = decode ]; then
      step peers-decode 200 peers_decode.log env PYTHONUNBUFFERED=1 python3 "$peers" --suite decode \
        --dtype float16 --providers sdpa_flash,sdpa_cudnn,ours --ours-module fusedattn --out "$dest/peers_decode.jsonl"
    elif [ "$run" = "$dt" ]; then
      # peers.py appends to --out: every repeat lands in the one file (and, balanced, in its
      # order's file too).
      for ((rep = 1; rep <= ${PEER_REPEAT:-1}; ++rep)); do
        providers=sdpa_flash,sdpa_cudnn,ours order=given
        if [ "${PEER_ORDER:-given}" = balanced ] && ((rep % 2 == 0)); then providers=sdpa_flash,ours,sdpa_cudnn order=swapped; fi
        step "peers-$suite-$run-$rep" 300 "peers_${suite}_${run}_$rep.log" env PYTHONUNBUFFERED=1 python3 "$peers" \
          --suite "$suite" --dtype "$dt" --providers "$providers" --ours-module fusedattn \
          --out "$dest/peers_${suite}_${run}_rep$rep.jsonl"
        cat "$dest/peers_${suite}_${run}_rep$rep.jsonl" >> "$dest/peers_${suite}_$run.jsonl"
        [ "${PEER_ORDER:-given}" = balanced ] && cat "$dest/peers_${suite}_${run}_rep$rep.jsonl" >> "$out/peers_${suite}_${run}_$order.jsonl"
        rm -f "$dest/peers_${suite}_${run}_rep$rep.jsonl"
      done
      python3 "$root/tools/perf_table.py" "$dest/peers_${suite}_$run.jsonl" > "$out/peers_${suite}_${run}_table.md" 2>&1
      if [ "${PEER_ORDER:-given}" = balanced ] && [ "${PEER_REPEAT:-1}" -gt 1 ]; then
        for order in given swapped; do
          python3 "$root/tools/perf_table.py" "$out/peers_${suite}_${run}_$order.jsonl" > "$out/peers_${suite}_${run}_${order}_order.md" 2>&1
        done
      fi
    else
      step "peers-fa-fwd-$run" 200 "peers_fa_fwd_$run.log" env FUSEDATTN_DISABLE_SM90=1 PYTHONUNBUFFERED=1 \
        python3 "$root/tools/bench_points.py" --points fa-fwd --dtype "$dt" --providers sdpa_flash,ours \
        --out "$dest/peers_fa_fwd_$run.jsonl"
    fi
  done
fi

if has points; then
  envs=()
  for e in ${POINT_ENVS:-}; do envs+=(--env "$e"); done
  # POINT_DTYPE, a comma list: one run per dtype, each its own process, log and JSON lines
  # (points.log and points.jsonl for one dtype, points_<dtype>.* for several).
  point_dtypes=${POINT_DTYPE:-float16}
  for dt in ${point_dtypes//,/ }; do
    name=points; [[ "$point_dtypes" == *,* ]] && name=points_$dt
    step "$name" 500 "$name.log" env PYTHONUNBUFFERED=1 python3 "$root/tools/bench_points.py" --points "$POINTS" \
      --providers "${POINT_PROVIDERS:-sdpa_flash,sdpa_cudnn,ours}" --dtype "$dt" \
      --repeat "${POINT_REPEAT:-1}" --order "${POINT_ORDER:-alternate}" "${envs[@]}" \
      $([ "${POINT_CLOCKS:-0}" = 1 ] && echo --clocks) --out "$dest/$name.jsonl"
  done
fi

if has power; then
  envs=()
  for e in ${POWER_ENVS:-}; do envs+=(--env "$e"); done
  power_dtypes=${POWER_DTYPE:-${POINT_DTYPE:-float16}}
  for dt in ${power_dtypes//,/ }; do
    name=power; [[ "$power_dtypes" == *,* ]] && name=power_$dt
    step "$name" 400 "$name.log" env PYTHONUNBUFFERED=1 python3 "$root/tools/bench_power.py" --points "$POWER_POINTS" \
      --providers "${POWER_PROVIDERS:-sdpa_cudnn,ours}" --dtype "$dt" "${envs[@]}" \
      --seconds "${POWER_SECONDS:-2}" --out "$dest/$name.jsonl"
  done
fi

if has span; then
  envs=()
  for e in ${SPAN_ENVS:-}; do envs+=(--env "$e"); done
  span_dtypes=${SPAN_DTYPE:-float16,bfloat16}
  for dt in ${span_dtypes//,/ }; do
    step "span_$dt" 300 "span_$dt.log" env PYTHONUNBUFFERED=1 python3 "$root/tools/call_span.py" --points "${SPAN_POINTS:-fwd:256:full:2048}" \
      --providers "${SPAN_PROVIDERS:-sdpa_cudnn,ours}" --dtype "$dt" "${envs[@]}"
  done
fi

if has chain; then
  envs=()
  for e in ${CHAIN_ENVS:-}; do envs+=(--env "$e"); done
  point_dtypes=${POINT_DTYPE:-float16}
  for mode in ${CHAIN_MODES:-runs}; do
    graph=(); [[ "$mode" == graph* ]] && graph=(--graph)
    [[ "$mode" == *-cold ]] && graph+=(--cold "${CHAIN_COLD_MIB:-128}")
    step "chain_$mode" 300 "chain_$mode.log" env PYTHONUNBUFFERED=1 python3 "$root/tools/chain_bench.py" \
      --points "${CHAIN_POINTS:-decode}" --providers "${CHAIN_PROVIDERS:-sdpa_cudnn,ours}" --dtype "${point_dtypes%%,*}" \
      "${envs[@]}" "${graph[@]}"
  done
fi

if has trace; then
  # A build of its own (the stamps are compiled in), the CLI only, with the main build's options
  # (GPU_CUDA_FLAGS included: a compile-time switch's kernels can be traced); each point's stamps
  # go to $dest as CSV and tools/sm90_trace.py's medians to the summary.
  tbuild=$root/build-trace
  TRACE_POINTS=${TRACE_POINTS:-256:2048,256:16384,128:2048}
  step trace-configure 120 trace_configure.log cmake -S "$root" -B "$tbuild" "${config[@]}" \
    -DFUSEDATTN_BUILD_TESTS=OFF -DFUSEDATTN_BUILD_CLI=ON -DFUSEDATTN_BUILD_PYTHON=OFF -DFUSEDATTN_SM90_TRACE=ON
  step trace-build 480 trace_build.log cmake --build "$tbuild" -j "$(nproc)" --target fusedattn_cli
  # The stamps take registers: a trace kernel that spills reloads from L2 where the stamps
  # sit, which the medians then count as boundary time (session 71: 260 B in the paired d256
  # tile put ~1600 cycles between its epilogue and the next tile's start; 0 B since session 73).
  ptxas_spills "$out/trace_build.log" > "$out/trace_spills.txt"
  note "trace build: kernels spilling $(grep -cE '[1-9][0-9]* bytes spill' "$out/trace_spills.txt"), most $(grep -oE '[0-9]+ bytes spill stores' "$out/trace_spills.txt" | sort -n | tail -1 || true) (their boundary figures include spill reloads)"
  for point in ${TRACE_POINTS//,/ }; do
    IFS=: read -r d s mask <<< "$point"
    mask=${mask:-full}
    shape=$(fa_point_args "$d" "$s" "$mask") || { note "trace point $point: mask must be full or causal"; continue; }
    csv=$dest/trace_d${d}_s${s}_$mask.csv
    rm -f "$csv"
    # shellcheck disable=SC2086  # $shape is a list of CLI arguments
    step "trace-d$d-s$s-$mask" 120 "trace_d${d}_s${s}_$mask.log" env FUSEDATTN_SM90_TRACE_FILE="$csv" "$tbuild/fusedattn" \
      --backend cuda $shape --dtype fp16 --warmup 1 --iters 2 --check-rows 0
    note "trace d$d $mask $s:"
    python3 "$root/tools/sm90_trace.py" "$csv" 2>&1 | tee -a "$summary"
  done
fi

tag=$(echo "$steps" | tr ',' '-')
tar czf "$dest/logs-$tag.tgz" -C "$out" . && cp "$summary" "$dest/summary-$tag.txt" && rm -f "$dest/summary-partial.txt"
echo; echo "==== summary ===="; cat "$summary"
# One run per dtype: its own table. Repeated runs: the per-point medians of perf_table.py.
for f in "$out"/peers_*.log; do
  [ "${PEER_REPEAT:-1}" -gt 1 ] && [[ "$f" =~ _[0-9]+\.log$ ]] && continue
  if [ -f "$f" ]; then echo "== $(basename "$f")"; sed -n '/^suite/,$p;/^point/,$p' "$f"; fi
done
if [ "${PEER_REPEAT:-1}" -gt 1 ]; then
  for f in "$out"/peers_*_order.md "$out"/peers_*_table.md; do [ -f "$f" ] && { echo "== $(basename "$f")"; cat "$f"; }; done
fi
for f in "$out"/points.log "$out"/points_*.log "$out"/power.log "$out"/power_*.log; do
  if [ -f "$f" ]; then echo "== $(basename "$f")"; grep -v "is_fx_tracing" "$f"; fi
done
for f in "$out"/chain_*.log; do
  if [ -f "$f" ]; then echo "== $(basename "$f")"; grep -v -i "warn" "$f"; fi
done
for f in "$out"/span_*.log; do
  if [ -f "$f" ]; then echo "== $(basename "$f")"; grep -v -i "warn" "$f"; fi
done
for f in "$out"/varlen_*.log "$out"/decode_varlen.log "$out"/documents_*.log; do
  if [ -f "$f" ]; then echo "== $(basename "$f")"; grep -v "is_fx_tracing" "$f"; fi
done
