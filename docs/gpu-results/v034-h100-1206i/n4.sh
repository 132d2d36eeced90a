# call 4: HEAD as the image ships it (stamped, the kept capture context) against 4bd5e8a (before core_first), the handler alone,
# page cache, on call 3's warm root, alternating
O=$OUT; T0=${T0:-$(date +%s)}
mkdir -p /tmp/c && tar xzf .devcalls/c.tgz -C /tmp/c && (cd /tmp/c && python3 -m worker vllm-contract --stamp | tail -1)
export OUT=/tmp/l4 VLLM_CACHE_ROOT=/tmp/vllm-cache-def-1 BENCH_END=$(( T0 + ${N4_S:-585} ))
mkdir -p $OUT; NEW=$PWD
ls -la worker/vllm_internals/contract-checked.json 2>&1 | tail -1
for i in 1 2 3 4 5 6; do
  for v in $( [ $((i % 2)) = 1 ] && echo "b new" || echo "new b" ); do
    D=$NEW; [ $v = b ] && D=/tmp/c
    (cd $D && OUT=/tmp/l4/$v REAL_WEIGHTS=1 DEFAULTS_PLAN="hcache-$i" bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep "first token\*\*\|skipped" | tail -1 | sed "s/^/$v $i: /")
  done
done
for v in b new; do for f in /tmp/l4/$v/cold-def-hcache-*.json; do
  [ -f $f ] && python3 -c "import json,sys;h=json.load(open(sys.argv[1]))['coldstart_handler']['handler'];p=h['phases_end_s'];print(sys.argv[2], sys.argv[1].split('-')[-1][:-5], h['first_token_s'], {k: round(v,2) for k,v in p.items()})" $f $v
done; done
tar czf $O/n4.tgz -C /tmp/l4 .
