#!/usr/bin/env bash
# A/B of two source trees on captured attention calls, for changes worth a microsecond or less a
# call (a decode step's split epilogue), where the CLI's times (ab_build.sh) hold the call's host
# work: the Python module built from this tree and from AB_BASE_SOURCE side by side, then
# tools/chain_bench.py --graph with each module in turn, REPEAT rounds, the two alternating.
#   AB_BASE_SOURCE=dir tools/ab_chain.sh [POINTS]
#     dir: the tree to compare against (e.g. `git archive main | tar -x -C dir`); POINTS as
#     chain_bench.py takes them (default: batch-1 decode steps at 4k and 32k keys, d128, 32 query
#     heads on 8). AB_HEADS (default 128) is both builds' FUSEDATTN_HEAD_DIMS; REPEAT (default 2)
#     rounds; CHAIN_PROVIDERS (default sdpa_cudnn,ours) the columns; CHAIN_ARGS more chain_bench
#     arguments (e.g. "--cold 128": K/V out of the L2).
# The builds go to build-chain-new/ and build-chain-base/, logs and each run's table to $OUT;
# last, per point and column, the medians over the rounds (us a pair, copy included) and ours'
# new / base time. Session 94 (docs/hopper.md) ran this by hand: a split-epilogue change whose
# traced combine got 500 cycles shorter read 0.3-0.5 us slower here, in every round.
set -uo pipefail
: "${AB_BASE_SOURCE:?AB_BASE_SOURCE=dir: the source tree to compare this one against}"
points=${1:-fwd:128:full:1:4096:1:32:8,fwd:128:full:1:32768:1:32:8}
dest=${OUT:-$PWD/gpu_logs}
mkdir -p "$dest"
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=fa_point.sh
source "$root/tools/fa_point.sh"
jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
config=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFUSEDATTN_CUDA=ON -DFUSEDATTN_SM90=ON -DFUSEDATTN_FULL=OFF
        -DFUSEDATTN_HEAD_DIMS="${AB_HEADS:-128}" -DFUSEDATTN_SM80_ARCHS=90 -DFUSEDATTN_BUILD_TESTS=OFF
        -DFUSEDATTN_BUILD_CLI=OFF -DFUSEDATTN_BUILD_PYTHON=ON -DFUSEDATTN_SM90_TRACE=OFF)
declare -A source=([new]=$root [base]=$AB_BASE_SOURCE)
for build in new base; do
  dir=$root/build-chain-$build
  drop_foreign_build "$dir" "${source[$build]}"
  (cmake -S "${source[$build]}" -B "$dir" "${config[@]}" > "$dest/ab_chain_configure_$build.log" 2>&1 &&
     cmake --build "$dir" -j "$jobs" > "$dest/ab_chain_build_$build.log" 2>&1
   echo "build $build: rc $?") &
done
wait
rm -f "$dest"/ab_chain_new_*.txt "$dest"/ab_chain_base_*.txt
for round in $(seq "${REPEAT:-2}"); do
  for build in new base; do
    # shellcheck disable=SC2086  # CHAIN_ARGS is a list of arguments
    PYTHONPATH=$root/build-chain-$build/python:$root/.devbuild/carry:${PYTHONPATH:-} \
      python3 "$root/tools/chain_bench.py" --points "$points" --providers "${CHAIN_PROVIDERS:-sdpa_cudnn,ours}" \
      --graph ${CHAIN_ARGS:-} > "$dest/ab_chain_${build}_$round.txt" 2>&1
    echo "round $round, $build:"
    grep -E "^(point|fwd)" "$dest/ab_chain_${build}_$round.txt"
  done
done
python3 "$root/tools/ab_chain_table.py" "$dest"
