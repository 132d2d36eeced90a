# call 3: the image's trim, the contract stamp on 0.34 (timed), then the goal's set: HEAD's handler and vLLM's
# server beside it, both roots filled (empty-1), then page-cache pairs
O=$OUT; T0=${T0:-$(date +%s)}
export OUT=/tmp/m BENCH_END=$(( T0 + ${M3_S:-588} ))
mkdir -p $OUT
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip uninstall -y -r scripts/image_trim.txt > $OUT/trim.log 2>&1
{ /usr/bin/time -f "stamp wall %e s rc %x" python3 -m worker vllm-contract --stamp; } > $OUT/stamp.log 2>&1
tail -4 $OUT/stamp.log; ls -la worker/vllm_internals/contract-checked.json 2>&1 | tail -1
python3 - > $OUT/stamped.log 2>&1 <<'PY'
import time; t=time.perf_counter()
from worker.vllm_internals import check as contract
print("stamped", contract._is_stamped() if hasattr(contract, "_is_stamped") else "n/a", round(time.perf_counter()-t, 3))
PY
cat $OUT/stamped.log | tail -2
DEFAULTS_MIN_S="150 95 80" DEFAULTS_PLAN="empty-1 cache-1 cache-2 cache-3 cache-4 cache-5" bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep -v "^\[" | grep "===\|first token\|skipped" | tail -14
for f in $OUT/cold-def-*.json; do
  python3 -c "import json,sys;c=json.load(open(sys.argv[1]))['coldstart'];h=c['handler'];s=c.get('vllm_server') or {};print(sys.argv[1].split('/')[-1], h['first_token_s'], s.get('first_token_s'), {k: round(v,2) for k,v in h['phases_end_s'].items()})" $f
done
tar czf $O/m3.tgz -C $OUT .
