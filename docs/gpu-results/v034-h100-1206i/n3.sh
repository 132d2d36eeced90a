# next session, call 3: the goal's set for cold disk and page cache with HEAD (stamp written first, as the image's build does)
O=$OUT; T0=${T0:-$(date +%s)}
export OUT=/tmp/n BENCH_END=$(( T0 + ${N3_S:-588} ))
mkdir -p $OUT
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip uninstall -y -r scripts/image_trim.txt > $OUT/trim.log 2>&1
python3 -m worker vllm-contract --stamp > $OUT/stamp.log 2>&1; tail -2 $OUT/stamp.log
DEFAULTS_MIN_S="150 95 80" DEFAULTS_PLAN="empty-1 disk-1 disk-2 disk-3 cache-1 cache-2" REAL_WEIGHTS=1 bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep -v "^\[" | grep "===\|first token\|skipped" | tail -14
for f in $OUT/cold-def-*.json; do
  python3 -c "import json,sys;c=json.load(open(sys.argv[1]))['coldstart'];h=c['handler'];s=c.get('vllm_server') or {};print(sys.argv[1].split('/')[-1], h['first_token_s'], s.get('first_token_s'), {k: round(v,2) for k,v in h['phases_end_s'].items()})" $f
done
tar czf $O/n3.tgz -C $OUT .
