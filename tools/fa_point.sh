# Sourced by the GPU machine's scripts (gpu_check.sh's trace, ab_build.sh, ncu_point.sh): one point
# of the FA grid (16k tokens, model dim 2048) as the fusedattn CLI's arguments.
#   fa_point_args HEAD_DIM SEQLEN MASK
# prints them, for a mask of full or causal; any other mask prints nothing and returns 1.
fa_point_args() {
  local d=$1 s=$2 mask=$3
  [ "$mask" = full ] || [ "$mask" = causal ] || return 1
  local args="--batch $((16384 / s)) --heads $((2048 / d)) --seqlen-q $s --seqlen-k $s --head-dim $d"
  [ "$mask" = causal ] && args="$args --causal"
  echo "$args"
}
