#!/usr/bin/env bash
# Two lists of bench stages (worker/tools/bench/stages.py) side by side, one per GPU of a two-GPU host, each
# with its own compile cache and output folder; each lane's output comes back packed as $OUT/laneN.tgz
# (rewritten after every run, so a call cut short still returns what finished), its console as $OUT/laneN.txt.
#
#   LANE_TIMEOUT=570 scripts/gpu_lanes.sh pod coldstart-real,stats-path
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:?OUT must name the folder that comes back}
lane() {  # gpu index, comma-separated stages
  CUDA_VISIBLE_DEVICES=$1 VLLM_CACHE_ROOT=/tmp/vcache$1 python3 -m worker bench --stage "$2" --out "/tmp/lane$1" \
    --archive "$DEST/lane$1.tgz" --time-limit "${LANE_TIMEOUT:-570}" > "$DEST/lane$1.txt" 2>&1
  echo "lane $1: exit $?" >> "$DEST/lane$1.txt"
}
lane 0 "$1" &
[ -n "${2:-}" ] && lane 1 "$2" &
wait
