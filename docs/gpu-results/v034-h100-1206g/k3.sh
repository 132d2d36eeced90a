# call 3: the image's trim, a fill, one GC-traced boot of the capture lever, then boots of three codes in turn
# (A = 6c4b7e4: the freeze before the fork; B = 4ef157c: + vLLM's import without the collector; C = HEAD:
# + the capture keeps the heap frozen), page cache, the handler alone, one warm root
O=$OUT; T0=${T0:-$(date +%s)}
for v in a b; do mkdir -p /tmp/$v && tar xzf .devcalls/$v.tgz -C /tmp/$v; done
export OUT=/tmp/k VLLM_CACHE_ROOT=/tmp/vcr-ab BENCH_END=$(( T0 + ${K3_S:-585} ))
mkdir -p $OUT; NEW=$PWD
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip uninstall -y -r scripts/image_trim.txt > $OUT/trim.log 2>&1; grep -i "successfully" $OUT/trim.log
echo "setup done at +$(( $(date +%s) - T0 )) s"
REAL_WEIGHTS=1 DEFAULTS_PLAN="hcache-0" bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep "first token\*\*\|skipped" | tail -1
echo "fill done at +$(( $(date +%s) - T0 )) s"
cp .devcalls/gcsite.py /tmp/site/sitecustomize.py
(OUT=/tmp/k/c DEFAULTS_PLAN="hcache-90" bash scripts/gpu_bench.sh coldstart-defaults 2>&1 | grep "first token\*\*\|skipped" | tail -1)
rm -f /tmp/site/sitecustomize.py
echo "gc trace done at +$(( $(date +%s) - T0 )) s"
bash .devcalls/triplets.sh 1 2 3
tar czf $O/k3.tgz -C /tmp/k .
