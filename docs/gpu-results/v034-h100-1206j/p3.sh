# call 3: the pod (two API processes) against vLLM 0.34's server (one API process) at 64, 256 and 512 streams, side by side
O=$OUT; T0=${T0:-$(date +%s)}
export OUT=/tmp/p3 BENCH_END=$(( T0 + ${P3_S:-585} ))
mkdir -p $OUT
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip uninstall -y -r scripts/image_trim.txt > $OUT/trim.log 2>&1
python3 -m worker vllm-contract --stamp > $OUT/stamp.log 2>&1; tail -1 $OUT/stamp.log
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $OUT/gpu.txt; cat $OUT/gpu.txt
POD_CONCURRENCY=64,256,512 POD_REPEATS=3 bash scripts/gpu_bench.sh pod-api2-vs-vllm1 2>&1 | tail -8
tar czf $O/p3.tgz -C $OUT .
