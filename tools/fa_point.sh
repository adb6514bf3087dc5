# shellcheck shell=bash
# Sourced by the GPU machine's scripts (gpu_check.sh's trace, ab_build.sh, ab_chain.sh,
# ncu_point.sh): one point of the FA grid (16k tokens, model dim 2048) as the fusedattn CLI's
# arguments, and the A/B builds' folder check.
#   fa_point_args HEAD_DIM SEQLEN MASK
# prints them, for a mask of full or causal; any other mask prints nothing and returns 1.
#   point_args D:MASK:SEQLEN  or  D:MASK:SQ:SK:BATCH:HQ:HKV
# the same for a point written as bench_points.py writes it without its "fwd:" (the long form any
# shape, e.g. a decode step 128:full:1:4096:1:32:8).
fa_point_args() {
  local d=$1 s=$2 mask=$3
  [ "$mask" = full ] || [ "$mask" = causal ] || return 1
  local args="--batch $((16384 / s)) --heads $((2048 / d)) --seqlen-q $s --seqlen-k $s --head-dim $d"
  [ "$mask" = causal ] && args="$args --causal"
  echo "$args"
}

point_args() {
  local d mask sq sk batch hq hkv extra
  IFS=: read -r d mask sq sk batch hq hkv extra <<< "$1"
  [ -z "$sk" ] && { fa_point_args "$d" "$sq" "$mask"; return; }
  { [ "$mask" = full ] || [ "$mask" = causal ]; } && [ -n "$hkv" ] && [ -z "$extra" ] || return 1
  local args="--batch $batch --heads $hq --kv-heads $hkv --seqlen-q $sq --seqlen-k $sk --head-dim $d"
  [ "$mask" = causal ] && args="$args --causal"
  echo "$args"
}

#   drop_foreign_build DIR SOURCE
# removes build folder DIR where it was configured from a source tree other than SOURCE (an
# earlier A/B's base): CMake refuses to reconfigure it, and its old binaries would be timed instead.
drop_foreign_build() {
  local dir=$1 src=$2
  if [ -f "$dir/CMakeCache.txt" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$dir/CMakeCache.txt"; then
    rm -rf "$dir"
  fi
}
