#!/usr/bin/env bash
# ncu on the Hopper forward kernel of single FA-grid points (16k tokens, model dim 2048, fp16),
# one launch each (the CLI's first timed one, after one warm-up), clocks left to the card.
#   tools/ncu_point.sh name:d:mask:seqlen[:NAME=VALUE] ...
#     mask: full or causal; NAME=VALUE an environment setting for that run (a runtime switch).
#   NCU_KERNEL (a regex, default fwd_kernel) and NCU_CLI_ARGS (added to the CLI's) pick another
#   kernel: NCU_KERNEL=bwd_main_kernel NCU_CLI_ARGS=--backward profiles the backward's main kernel.
# Per point it prints the L2 and DRAM traffic, the tensor pipe's activity, the instruction cache's
# requests and misses, and the average warp stalls per issued instruction by reason; with
# NCU_SOURCE=1 it also keeps the report and prints tools/ncu_regions.py's summary of the SASS source
# page (which runs of code stall, and on what, and the 30 instructions with the most stall
# samples). Reports and source pages go to $OUT.
# Uses build-gpu/fusedattn (tools/gpu_check.sh sm90 build makes it).
set -uo pipefail
dest=${OUT:-$PWD/gpu_logs}
mkdir -p "$dest"
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=fa_point.sh
source "$root/tools/fa_point.sh"
cli=$root/build-gpu/fusedattn
[ -x "$cli" ] || { echo "no $cli: run tools/gpu_check.sh sm90 build first" >&2; exit 2; }
metrics=lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum
metrics=$metrics,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg
metrics=$metrics,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,sm__icc_requests.sum,sm__icc_requests_lookup_miss.sum,smsp__inst_executed.sum
metrics=$metrics,"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for point in "$@"; do
  IFS=: read -r name d mask s setting <<< "$point"
  shape=$(fa_point_args "$d" "$s" "$mask") || { echo "point $point: mask must be full or causal"; continue; }
  echo "== $name: d$d fp16 $mask $s ${setting:-}"
  source_sections=()
  [ "${NCU_SOURCE:-0}" = 1 ] && source_sections=(--section SourceCounters -o "$dest/$name")
  # shellcheck disable=SC2086  # NCU_CLI_ARGS is a list of CLI arguments
  env ${setting:-} ncu --clock-control none -s 1 -c 1 -k "regex:${NCU_KERNEL:-fwd_kernel}" --metrics "$metrics" \
    "${source_sections[@]}" "$cli" --backend cuda $shape --dtype fp16 --warmup 1 --iters 1 --check-rows 0 ${NCU_CLI_ARGS:-} \
    > "$dest/$name.ncu.log" 2>&1 || { tail -5 "$dest/$name.ncu.log"; continue; }
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    # With -o the metrics went to the report only: its details page prints them as a live run does.
    ncu --import "$dest/$name.ncu-rep" --page details > "$dest/$name.ncu.log" 2>&1
    ncu --import "$dest/$name.ncu-rep" --page source --csv --print-source sass > "$dest/$name.source.csv" 2>&1
    python3 "$root/tools/ncu_regions.py" "$dest/$name.source.csv" --min-run 16 --top 30
  fi
  # The metric lines, the stall reasons shortened to their names; zero stalls left out.
  grep -E "^\s+(lts|dram|sm__|smsp)" "$dest/$name.ncu.log" |
    sed -E 's/smsp__average_warps_issue_stalled_(.*)_per_issue_active.ratio/stall \1/' |
    awk '$NF != "0" && $NF != "0.00"'
done
