#!/usr/bin/env bash
# Two stage lists of scripts/gpu_bench.sh side by side, one per GPU of a two-GPU host, each with its own
# compile cache and output folder; each lane's output comes back packed as $OUT/laneN.tgz (updated after
# every stage, so a call cut short still returns what finished), its console as $OUT/laneN.txt.
#
#   LANE_TIMEOUT=570 scripts/gpu_lanes.sh "pod" "coldstart-jit"
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:?OUT must name the folder that comes back}
lane() {  # gpu index, stage list
  local gpu=$1 dir=/tmp/lane$1
  mkdir -p "$dir"
  # shellcheck disable=SC2086  # the stage list is split into words on purpose
  CUDA_VISIBLE_DEVICES=$gpu VLLM_CACHE_ROOT=/tmp/vcache$gpu OUT=$dir ARCHIVE=$DEST/lane$gpu.tgz \
    timeout -k 10 "${LANE_TIMEOUT:-570}" bash scripts/gpu_bench.sh $2 > "$DEST/lane$gpu.txt" 2>&1
  echo "lane $gpu: exit $?" >> "$DEST/lane$gpu.txt"
}
lane 0 "$1" &
[ -n "${2:-}" ] && lane 1 "$2" &
wait
