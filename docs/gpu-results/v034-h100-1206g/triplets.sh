# boots of A, B and C in turn, the order rotated each round; the arguments: the rounds' numbers
NEW=$PWD
for i in "$@"; do
  case $(( i % 3 )) in 0) ORDER="a b c";; 1) ORDER="b c a";; 2) ORDER="c a b";; esac
  for v in $ORDER; do
    D=$NEW; [ $v != c ] && D=/tmp/$v
    (cd $D && OUT=/tmp/k/$v DEFAULTS_PLAN="hcache-$i" bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep "first token\*\*\|skipped" | tail -1 | sed "s/^/$v $i: /")
  done
done
cd $NEW
for v in a b c; do for f in /tmp/k/$v/cold-def-hcache-*.json; do
  [ -f $f ] && python3 -c "import json,sys;h=json.load(open(sys.argv[1]))['coldstart_handler']['handler'];p=h['phases_end_s'];print(sys.argv[2], sys.argv[1].split('-')[-1][:-5], h['first_token_s'], p.get('vllm_import'), round(h['first_token_s']-p.get('vllm_import',0),2), p.get('cuda_graph_capture'), p.get('engine_init_done'))" $f $v
done; done
for v in c; do grep -h "GCTIME" /tmp/k/$v/cold-def-hcache-90/coldstart-handler.log 2>/dev/null | awk -v v=$v '{print v, $2, $3, $5, $6, $7, $8}' | tail -8; done
