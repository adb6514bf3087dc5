#!/usr/bin/env bash
# Batch-1 decode's cache stream against where the tail split's parts start (docs/hopper.md,
# session 90). One query token, 32 query heads on 8 KV heads, d128, fp16: the CLI's kernel time
# (median of --iters) at key lengths whose 128-key blocks split evenly into the parts (1024 blocks:
# every part starts on a 4 MiB boundary of its head's keys) or not (1027 blocks), in both layouts
# (bhsd: a head's keys contiguous, as peers.py passes them; bshd: a head's rows 2 KiB apart), under
# forced share counts (FUSEDATTN_SM90_TAIL_SHARES: 64 = 8 parts a tile, the default plan up to session
# 90; since session 91 the default takes 16 parts at 128k keys (fwd_split.h, few_rows_parts); 56 and 48
# = 7 and 6 parts, whose boundaries fall off the 4 MiB grid). Then cuDNN (torch SDPA, through
# tools/bench_points.py: peers.py from .devbuild/carry/) on the bhsd shapes. Prints K+V bytes read per second, GB/s, one line per reading, with the CLI's host_ms
# (the call's host time up to its return, which its time_ms includes).
#   tools/decode_stream.sh [REPEAT]     (uses build-gpu/fusedattn: tools/gpu_check.sh sm90 build)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cli=$root/build-gpu/fusedattn
[ -x "$cli" ] || { echo "no $cli: run tools/gpu_check.sh sm90 build first" >&2; exit 2; }
repeat=${1:-3}
heads_q=32 heads_kv=8 dim=128 elem_bytes=2
lengths=(131072 131456 32768 33152)
gbps() {  # keys ms -> GB/s of K and V
  awk -v k="$1" -v ms="$2" -v h="$heads_kv" -v d="$dim" -v e="$elem_bytes" \
    'BEGIN { printf "%.0f", 2 * h * k * d * e / (ms * 1e-3) / 1e9 }'
}
for rep in $(seq "$repeat"); do
  for keys in "${lengths[@]}"; do
    for layout in bhsd bshd; do
      for shares in default 56 48; do
        env_set=()
        [ "$shares" != default ] && env_set=(FUSEDATTN_SM90_TAIL_SHARES="$shares")
        line=$(env "${env_set[@]}" "$cli" --backend cuda --batch 1 --heads "$heads_q" --kv-heads "$heads_kv" \
          --seqlen-q 1 --seqlen-k "$keys" --head-dim "$dim" --dtype fp16 --layout "$layout" \
          --warmup 20 --iters 200 --check-rows 0 2>&1 | grep -o "time_ms=[0-9.]* host_ms=[0-9.]*")
        read -r ms host <<< "$line"
        ms=${ms#time_ms=} host=${host#host_ms=}
        [ -n "$ms" ] || { echo "ours keys=$keys layout=$layout shares=$shares: no time"; continue; }
        echo "ours rep=$rep keys=$keys layout=$layout shares=$shares ms=$ms host_ms=$host GB/s=$(gbps "$keys" "$ms")"
      done
    done
  done
done
# cuDNN on the same shapes, as peers.py builds and times them (tools/bench_points.py; its q, k, v
# are bhsd), its readings in the lines above' form.
points=$(printf "fwd:$dim:full:1:%s:1:$heads_q:$heads_kv," "${lengths[@]}")
records=$(mktemp)
trap 'rm -f "$records"' EXIT
python3 "$root/tools/bench_points.py" --points "${points%,}" --providers sdpa_cudnn --repeat "$repeat" \
  --out "$records" >&2
while read -r rep keys ms; do
  echo "cudnn rep=$rep keys=$keys layout=bhsd ms=$ms GB/s=$(gbps "$keys" "$ms")"
done < <(python3 -c 'import json, sys
for r in map(json.loads, open(sys.argv[1])): print(r.get("rep", 0) + 1, r["Sk"], r["ms"])' "$records")
