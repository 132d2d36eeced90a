# call 6: cold-disk pairs with HEAD (core_first, stamped), vLLM's server beside each, call 3's roots
O=$OUT; T0=${T0:-$(date +%s)}
export OUT=/tmp/n6 BENCH_END=$(( T0 + ${N6_S:-330} ))
mkdir -p $OUT
ls -la worker/vllm_internals/contract-checked.json 2>&1 | tail -1
for i in 4 5 6 7 8; do
  DEFAULTS_MIN_S="150 95 80" DEFAULTS_PLAN="roots-1 disk-$i" REAL_WEIGHTS=1 bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep "first token\*\*\|skipped" | tail -1 | sed "s/^/$i: /"
done
for f in $OUT/cold-def-disk-*.json; do
  python3 -c "import json,sys;c=json.load(open(sys.argv[1]))['coldstart'];h=c['handler'];s=c.get('vllm_server') or {};p=h['phases_end_s'];print(sys.argv[1].split('/')[-1], h['first_token_s'], s.get('first_token_s'), round(h['first_token_s']/s['first_token_s'],3) if s.get('first_token_s') else None, p['vllm_import'])" $f
done
tar czf $O/n6.tgz -C $OUT .
