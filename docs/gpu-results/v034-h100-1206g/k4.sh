# call 4: more rounds of the three codes (k3.sh), the same root
O=$OUT; T0=$(date +%s)
export OUT=/tmp/k VLLM_CACHE_ROOT=/tmp/vcr-ab BENCH_END=$(( T0 + ${K4_S:-585} ))
bash .devcalls/triplets.sh ${K4_ROUNDS:-4 5 6 7 8 9}
tar czf $O/k4.tgz -C /tmp/k .
