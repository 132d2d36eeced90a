#!/usr/bin/env bash
# vLLM's own server with --api-server-count N over one engine core, driven by vLLM's own
# `bench serve`: the baseline for pods with several API processes. The 8B Llama shape with dummy
# weights, bf16, no speculation; random prompts of 128 tokens, 256 output tokens (ignore EOS),
# 2 x concurrency prompts per point. Needs vLLM importable (`. /tmp/vc/env.sh` on the H200).
#
#   COUNTS="1 2 4" CONCURRENCY="64 256 512" OUT=$OUT ARCHIVE=$OUT/api.tgz scripts/gpu_api_servers.sh
#
# Writes $OUT/api-servers/: n<N>-c<C>.json (bench serve's results), the servers' and clients' logs.
set -uo pipefail
OUT=${OUT:-./bench-gpu}
D=$OUT/api-servers
M=${MODEL_DIR:-/tmp/llama8b}
mkdir -p "$D"
[ -f "$M/config.json" ] || python3 -m worker bench --make-llama8b "$M" > "$D/make.log" 2>&1
vllm() { python3 -c 'import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = "vllm"; sys.exit(main())' "$@"; }
ready() {  # port pid: wait for /health, at most 600 s
  python3 - "$1" "$2" <<'PY'
import sys, time, urllib.request, os
port, pid, t = sys.argv[1], int(sys.argv[2]), time.time()
while time.time() - t < 600:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
            print(f"ready in {time.time() - t:.1f} s"); sys.exit(0)
    except Exception:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        print("server exited"); sys.exit(1)
    time.sleep(1)
print("not ready in 600 s"); sys.exit(1)
PY
}
for n in ${COUNTS:-1 2 4}; do
  port=$((8100 + n))
  setsid python3 -c 'import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = "vllm"; sys.exit(main())' serve "$M" --port "$port" --load-format dummy --dtype bfloat16 --api-server-count "$n" \
    --max-num-seqs 512 --disable-uvicorn-access-log > "$D/server-n$n.log" 2>&1 &
  pid=$!
  echo "n=$n $(ready $port $pid)" | tee -a "$D/summary.txt"
  for c in ${CONCURRENCY:-64 256 512}; do
    vllm bench serve --backend openai --base-url "http://127.0.0.1:$port" --model "$M" --tokenizer "$M" \
      --dataset-name random --random-input-len 128 --random-output-len 256 --ignore-eos \
      --num-prompts $((c * 2)) --max-concurrency "$c" --num-warmups 16 \
      --save-result --result-dir "$D" --result-filename "n$n-c$c.json" > "$D/client-n$n-c$c.log" 2>&1
    echo "n=$n c=$c $(grep -E 'Output token throughput|Median TTFT' "$D/client-n$n-c$c.log" | tr -s ' ' | tr '\n' ' ')" \
      | tee -a "$D/summary.txt"
  done
  # With N > 1 the server did not exit on SIGINT within minutes (seen on the H200): bounded, then killed.
  kill -INT "$pid"; timeout 30 tail --pid="$pid" -f /dev/null || echo "n=$n: no exit 30 s after SIGINT" | tee -a "$D/summary.txt"
  pkill -9 -f "vllm.entrypoints|multiprocessing" 2>/dev/null; sleep 3
  [ -n "${ARCHIVE:-}" ] && tar czf "$ARCHIVE" -C "$OUT" api-servers
done
