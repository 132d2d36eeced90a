# call 5: more of the goal's set (page cache, vLLM's server beside each, call 3's roots), the contract stamp
# removed before every other boot (its share: vllm_config - vllm_import)
O=$OUT; T0=${T0:-$(date +%s)}
export OUT=/tmp/m5 BENCH_END=$(( T0 + ${M5_S:-540} ))
mkdir -p $OUT
for i in 6 7 8 9 10 11 12 13; do
  if [ $((i % 2)) = 0 ]; then python3 -m worker vllm-contract --stamp > /dev/null 2>&1; s=stamped; else rm -f worker/vllm_internals/contract-checked.json; s=unstamped; fi
  DEFAULTS_MIN_S="150 95 80" DEFAULTS_PLAN="roots-1 cache-$i" bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep "first token\*\*\|skipped" | tail -1 | sed "s/^/$s $i: /"
  [ -f $OUT/cold-def-cache-$i.json ] && echo $s > $OUT/cold-def-cache-$i.stamp
done
for f in $OUT/cold-def-cache-*.json; do
  python3 -c "import json,sys;c=json.load(open(sys.argv[1]))['coldstart'];h=c['handler'];s=c.get('vllm_server') or {};p=h['phases_end_s'];print(sys.argv[1].split('/')[-1], open(sys.argv[1][:-5]+'.stamp').read().strip(), h['first_token_s'], s.get('first_token_s'), round(p['vllm_config']-p['vllm_import'],2), p['vllm_import'])" $f
done
tar czf $O/m5.tgz -C $OUT .
