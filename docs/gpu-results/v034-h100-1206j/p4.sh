# call 4: the engine's ceiling beside the pod's figures: raw AsyncLLM and the handler on one engine, MAX_NUM_SEQS=512, 256 and 512 streams
O=$OUT; T0=${T0:-$(date +%s)}
export OUT=/tmp/p4 BENCH_END=$(( T0 + ${P4_S:-585} ))
mkdir -p $OUT
bash scripts/gpu_bench.sh ceiling 2>&1 | tail -6
tar czf $O/p4.tgz -C $OUT .
