#!/usr/bin/env bash
# The GPU benchmark: a Llama-3-8B-shaped model with dummy weights (no download), run in stages
# so that each fits a 10-minute call. Needs vLLM importable (e.g. `. /tmp/vc/env.sh` on the H200,
# see docs/benchmarks.md) and writes bench JSON and logs under $OUT (default ./bench-gpu); with
# ARCHIVE set, everything under $OUT is also packed into that .tgz after every stage, so a call
# cut short still returns what it measured. STAGE_TIMEOUT (seconds) bounds each run.
#
#   scripts/gpu_bench.sh overhead fp8       # then: POD_CONCURRENCY=8,256 scripts/gpu_bench.sh pod coldstart-server ngram
#
# Engines run vLLM's V2 runner (the only GPU runner of vLLM 0.34) and follow TORCH_COMPILE=auto (compile-free
# FULL graphs for the handler path, torch.compile for the pod) unless a stage sets it.
#
# Stages:
#   overhead          handler path vs raw AsyncLLM, bf16, concurrency 1, 8, 64, 256 (3 alternating runs)
#   ceiling           the same with MAX_NUM_SEQS=512 at $CEILING_CONCURRENCY (default 256,512): raw AsyncLLM is the
#                     engine's own ceiling for the pod-against-vLLM's-server stages at those loads
#   overhead-ids      the same at 64 and 256, AsyncLLM given token ids made once (tokenization charged to the handler)
#   fp8               the same for fp8 at concurrency 1, 64 and 256 (3 alternating runs)
#   fp8-si8           fp8 again with STREAM_INTERVAL=8 (an engine output per 8 tokens) for both paths
#   quant             AWQ with the Marlin kernel, then Machete, at concurrency 1 and 256 ($QUANT_REPEATS runs, default 3);
#                     each kernel alone: quant-marlin, quant-machete
#   pod               pod server vs vLLM's OpenAI server booted side by side, concurrency
#                     $POD_CONCURRENCY (default 1,8,64,256), $POD_REPEATS (default 3) alternating runs
#   pod-spec          the pod stage with both servers speculating alike ($POD_BENCH_FIRST=vllm_server boots vLLM first): $POD_SPEC (DRAFTER:K:LENGTH, default the
#                     1B-shaped draft, k = 3, synthetic L = 2.5), static, at $POD_CONCURRENCY (default 1-256)
#   pod-api-servers   the pod stage with API_SERVER_COUNT=N for N in $API_SERVERS (default "2 1"), vLLM's server
#                     with the same --api-server-count, at $POD_CONCURRENCY (default 64,256,512), MAX_NUM_SEQS=512
#                     and MAX_QUEUE_DEPTH=512 (no 429 at 512 streams), $POD_REPEATS alternating runs (default 3)
#   pod-api2-vs-1     the pod with API_SERVER_COUNT=2 against the pod with 1, side by side, at $POD_CONCURRENCY
#                     (default 1,8), the same settings as pod-api-servers
#   pod-api2-vs-vllm1 the pod with API_SERVER_COUNT=2 against vLLM's server with one API process (vllm serve's
#                     default), side by side, at $POD_CONCURRENCY (default 256,512), the same settings
#   pod-spawn         the pod stage with VLLM_WORKER_MULTIPROC_METHOD=spawn given to both servers: what measured
#                     the pod's switch from vLLM's library default (fork) to spawn, now the pod's own default
#   pod-profile       the pod stage at 1 and 64 streams, 2 runs, with a py-spy profile of each server's API
#                     process per run and concurrency (PY_SPY: a py-spy binary; pod/py-spy-*.txt, collapsed stacks)
#   coldstart         handler cold start: fresh compile cache, warm compile cache, eager
#   coldstart-server  handler and vLLM's server, warm compile cache
#   coldstart-levers  real-size weights (16 GB of random bf16 safetensors, written first, then in the page
#                     cache): handler with an empty compile cache, a warm one (and vLLM's server), eager,
#                     MAX_NUM_SEQS=16 (fewer CUDA-graph sizes), no CUDA-graph memory estimate at profiling
#   coldstart-levers-v1  the handler's default runner (V1), real-size weights: an empty compile cache, a warm
#                     one, then warm with MAX_NUM_SEQS=16 and without the CUDA-graph memory estimate
#   coldstart-loaders real-size weights, warm caches: vLLM's default loader against fastsafetensors, Run:ai's
#                     streamer and instanttensor (LOAD_FORMAT). The loaders are not in the vLLM carry: their
#                     wheels (pip download --no-deps --only-binary :all: --python-version 3.12
#                     --platform manylinux_2_28_x86_64 fastsafetensors runai-model-streamer instanttensor
#                     typer humanize shellingham py-spy) travel beside it and
#                     `python3 scripts/unpack_wheels.py /tmp/extra <wheels>` unpacks them there (py-spy too)
#   coldstart-fresh-home  real-size weights, V1: a boot that fills an empty cache root, then one with that cache
#                     root and an empty HOME (a fresh container on a warm network volume: ~/.triton empty)
#   coldstart-container  dummy weights, V1: a boot that fills an empty cache root, then one with that root and an
#                     empty HOME and TMPDIR (a fresh container on a warm network volume), then one with every cache
#                     warm; made the cold-container-* files (the same three boots, run by hand)
#   coldstart-plan    dummy weights, V1, fresh containers on one warm cache root: vLLM's startup plan
#                     (VLLM_ENABLE_STARTUP_PLAN) written once, then off / on alternating ($PLAN_ROUNDS)
#   coldstart-seqs16  the same root: MAX_NUM_SEQS=16 (fewer CUDA-graph sizes), compiled once, then two boots
#   coldstart-triton-ab  real-size weights, V1: a boot that fills an empty cache root, then four boots with that
#                     root, each with an empty HOME, alternating the worker's TRITON_CACHE_DIR default and the old
#                     behaviour (Triton's cache in HOME); made the cold-ab* files (one cache root, same loop)
#   coldstart-disk    real-size weights from a cold disk (scripts/page_cache.py evicts them, residency checked):
#                     after a fill, rounds of PREFETCH_WEIGHTS=false / true evicted ($DISK_ROUNDS), then in the
#                     page cache ($CACHE_ROUNDS); a later call on the same machine reuses the filled cache root
#   coldstart-graphs  issue 50's serverless defaults (CUDAGRAPH_MODE=auto) and vLLM's own server beside them, real-size
#                     weights, MAX_NUM_SEQS=128: the steps of $GRAPHS_PLAN (fill, page-cache and cold-disk boot pairs,
#                     the handler alone, FULL_AND_PIECEWISE against the default, the multithreaded loader, decode
#                     in both modes; the stage's comment lists them). BENCH_END (epoch seconds) bounds the call
#   coldstart-defaults  issue 50's three cases with today's serverless defaults and vLLM's server beside each boot:
#                     the steps of $DEFAULTS_PLAN (empty-N, roots-N, disk-N, cache-N; hempty-N, hdisk-N, hcache-N:
#                     the handler alone); one stage per GPU can run
#                     side by side, each with its own N for its roots
#   coldstart-first   an endpoint's first worker without a network volume (issue 75): the handler alone, real-size
#                     weights in the page cache, MAX_NUM_SEQS=128, every boot in a fresh container (empty HOME and
#                     TMPDIR) on a cache root of its own: the steps of $FIRST_PLAN (default "fill empty-1 jit-1
#                     seeded-1"): fill (a root whose Triton cache the seeded boots copy), empty-N (today's first
#                     worker), jit-N (VLLM_TRITON_JIT_WARMUP_NUM_THREADS=$FIRST_JIT_THREADS, default the CPU count,
#                     against vLLM's 4), seeded-N (an empty root but Triton's cache a copy of the fill's: what a
#                     Triton cache shipped in the image would give), image-N (the whole cache root of that boot
#                     given to the worker as CACHE_SEED, which it copies into the new root at boot: the image's
#                     path, Triton's kernels with vLLM's model-class answers and startup plan), trim (the image's scripts/image_trim.txt
#                     uninstalled from this Python, as the Dockerfile does, for the rest of the machine's life;
#                     python -X importtime of the boot's imports before and after, and of the RunPod SDK's
#                     import). ENGINE_ARGS from the caller passes through (issue 75's compile-free FULL graphs
#                     before they are the serverless default)
#   coldstart-empty   real-size weights: every boot on an empty cache root of its own, weights evicted first,
#                     PREFETCH_WEIGHTS on / off alternating ($EMPTY_ROUNDS)
#   coldstart-disk-ab the last empty root, weights evicted before each boot, PREFETCH_WEIGHTS off / on ($DISK_AB_ROUNDS)
#   coldstart-cache-ab the last empty root, weights in the page cache, PREFETCH_WEIGHTS off / on ($CACHE_AB_ROUNDS)
#   coldstart-beside  real-size weights: the handler and vLLM's own server (its own cache root) one after the other,
#                     both roots empty (the fill), then rounds ($BESIDE_ROUNDS) with the weights evicted before each
#                     boot (cold disk) and in the page cache; the handler logs its import and config stamps
#   lossless          is speculation lossless at temperature > 0? The tiny models (draft model, with and without the
#                     stats path, and n-gram) against an A/A control, token distributions position by position
#   coldstart-server-real  real-size weights, both on vLLM's default V2 runner: a handler boot that fills an
#                     empty compile cache, then the handler and vLLM's own server each with that warm cache
#   coldstart-jit     the two largest phases of a warm boot (docs/benchmarks.md): main-process imports
#                     (python -X importtime, twice) and vLLM's kernel warm-up before the CUDA-graph capture
#                     (off through ENGINE_ARGS kernel_config), each boot after one that fills the caches,
#                     then the first request's TTFT with that warm-up off
#   runner-ngram      n-gram speculation on the V2 model runner (spec-ngram's table, $SPEC_KS default 2,4,8:
#                     runner-ngram-spec), then n-gram k=4 handler vs AsyncLLM at 1, 64, 256
#                     (runner-ngram-v2; $NGRAM_REPEATS runs, default 1)
#   compile-decode    decode without speculation compiled (TORCH_COMPILE=on), then compile-free (off), 3 runs
#                     each at 1, 16, 64, 256: the trade behind TORCH_COMPILE=auto
#   eager-decode      decode speed in eager mode (no CUDA graphs, no compile) at 1 and 64, 1 run
#   first-request     TTFT of the first request after boot vs the next five (1 s idle each), warm-up on and off;
#                     the same for the first request using the sampler's features (penalties, top-k/p, min-p, seed)
#   ngram             n-gram speculation (k=4) vs none, single stream
#   spec-map          where speculation pays (issue 49): no speculation, n-gram at static k=2 on V2 as ngram_gpu
#                     (async scheduling; at synthetic mean acceptance length 2.5 the best static k), n-gram under
#                     SPECULATION_CONTROL=auto (V2, ngram_gpu, the worker's schedule) at L=2.5 and at L=1 (0%), side by side at
#                     $MAP_CONCURRENCY (default 1,8,32,64,128,256), $MAP_TOKENS tokens (128), $MAP_REPEATS alternating
#                     runs (3; none started after $MAP_DEADLINE_S s): $MAP_CONFIGS names others (spec_map.py);
#                     $MAP_MIX (e.g. 1.0,0.6,0.0; unset: none) mixes acceptance classes in each wave (V2, LENGTH K + 1);
#                     $MAP_LENGTH_SPREAD (e.g. 0.5; default 0) gives each request a length of its own around $MAP_TOKENS
#   spec              n-gram at k=2/4/8, the target as its own draft and a 1B-shaped draft at k=4, single stream,
#                     with the acceptance watchdog's verdict per point (4 requests, $SPEC_ROUNDS rounds of them, default 3);
#                     its two halves run alone as spec-ngram and spec-draft
#   stats-ngram       n-gram k=4 (vLLM's sync scheduler): handler vs AsyncLLM, and the exact-stats path
#                     on vs off (two engines side by side), concurrency 1, 8, 64, 256 (3 alternating runs)
#   stats-draft       the same with a Llama-3.2-1B-shaped draft model, k=4 (vLLM's async scheduler), 64 tokens
#   stats-path        the stats path's own CPU time per engine step on this host (bench part stats_path: vLLM's
#                     per-request tracking, the worker's hooks and the answers to stop strings' aborts timed alone,
#                     the answers' msgpack transport with minus without), against the step of an n-gram k=4 engine
#                     measured in the same run, 1 run; the overhead part's exactness check there also runs as many
#                     stop-string jobs as the highest concurrency
#   stats-path-procs  the stats path alone (no engine) in $STATS_PATH_PROCS separate processes in turn (default 5),
#                     batch $STATS_PATH_SIZES (default 1,8,64,256): between processes its figures spread more than
#                     within one, so each process's JSON is kept (stats-path-procs/N.json) and the medians printed
#   stats-ngram-aa    stats-ngram with an A/A control: a third engine identical to the first (a third of the
#                     memory each), so the stats-off difference can be judged against two equal engines' spread
# On two GPUs (TENSOR_PARALLEL_SIZE=2):
#   tp2-70b           a Llama-3-70B shape in bf16, n-gram k=4: handler vs AsyncLLM at 1, 64, 256 (3 alternating
#                     runs), then per-request spec_decode summed against vLLM's engine counters
#   tp2-70b-fp8       the same in fp8 (TP2_REPEATS: runs per point for both, default 3)
#   tp2-8b            the 8B shape, no speculation, at 1 and 256 (against the bf16 stage's TP=1 figures)
#   tp2-faults        scripts/gpu_faults.py on the 70B shape (eager: faults do not depend on CUDA graphs)
# Stages can run side by side on two GPUs: give each its own CUDA_VISIBLE_DEVICES, OUT and ARCHIVE.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-gpu}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD
# The worker's vLLM plugin (worker/vllm_internals/plugin.py) is found through the package's entry point, which
# the installed package's metadata carries: a checkout on PYTHONPATH without runpod_vllm_worker.egg-info
# (git ignores it; carry it) runs engines without it, as the image never does. Say so loudly.
python3 -c "from importlib.metadata import entry_points as e
import sys; sys.exit('runpod_worker' not in {p.name for p in e(group='vllm.general_plugins')})" ||
  echo "gpu_bench: WARNING: the worker's vLLM plugin is not installed here (no runpod_vllm_worker.egg-info): engines run without it" >&2
M=/tmp/llama8b
[ -f $M/config.json ] || python3 -m worker bench --make-llama8b $M
[ -f $M-awq/config.json ] || python3 -m worker bench --make-llama8b $M-awq --awq
[ -f $M-1b/config.json ] || python3 -m worker bench --make-llama8b $M-1b --shape llama-3.2-1b
[ -f $M-eagle3/config.json ] || python3 -m worker bench --make-llama8b $M-eagle3 --shape eagle3-llama-3-8b
# Real-size random weights (16 GB) for the cold-start stages; stages running side by side must not
# both write them, so a first call without stages makes them: REAL_WEIGHTS=1 scripts/gpu_bench.sh
# REAL_WEIGHTS_DIR: another copy (stages side by side on several GPUs each evict their own weights, and an
# eviction empties the page cache of every stage that reads the same files); made by copying the first.
R0=/tmp/llama8b-real
R=${REAL_WEIGHTS_DIR:-$R0}
real_weights() {
  [ -f $R/model.safetensors.index.json ] && return
  if [ "$R" != $R0 ] && [ -f $R0/model.safetensors.index.json ]; then
    rm -rf $R.part && cp -r $R0 $R.part && mv $R.part $R
  else
    python3 -m worker bench --make-llama8b $R --random-weights
  fi
}
if [ -n "${REAL_WEIGHTS:-}" ]; then real_weights; fi
case " $* " in *" tp2-70b"* | *" tp2-faults "*)
  [ -f /tmp/llama70b/config.json ] || python3 -m worker bench --make-llama8b /tmp/llama70b --shape llama-3-70b ;;
esac
export MODEL_NAME=$M LOAD_FORMAT=dummy MAX_MODEL_LEN=4096 MAX_NUM_SEQS=256 SPECULATIVE_METHOD=none
# The roofline's card (a name of worker/tools/sizing.py's GPUS): GPU_LABEL as given, else the card's name
# as nvidia-smi says it (an H100 80GB HBM3 is the SXM part), else H200.
if [ -z "${GPU_LABEL:-}" ]; then
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H100*PCIe*) GPU_LABEL="H100 PCIe" ;; *H100*) GPU_LABEL="H100 SXM" ;;
    *A100*80GB*) GPU_LABEL="A100 80GB" ;; *A100*) GPU_LABEL="A100 40GB" ;; *L40S*) GPU_LABEL=L40S ;;
    *) GPU_LABEL=H200 ;;
  esac
fi
B=(python3 -m worker bench --gpu "$GPU_LABEL" --max-tokens 256 --num-requests 0)
run() {  # label, then bench arguments
  local label=$1; shift
  # BENCH_END (epoch seconds): the call's end. A run needing more than RUN_MIN_S (default 60) of what is
  # left is skipped, and each run is cut 10 s before it, so that the archive is written within the call.
  local limit=${STAGE_TIMEOUT:-0}
  if [ -n "${BENCH_END:-}" ]; then
    local left=$((BENCH_END - $(date +%s) - 10))
    if [ $left -lt "${RUN_MIN_S:-60}" ]; then echo "=== $label: skipped, ${left}s left"; return; fi
    if [ "$limit" = 0 ] || [ $left -lt "$limit" ]; then limit=$left; fi
  fi
  echo "=== $label: $(date +%T)"
  # Every process of this stage (servers start their own sessions) inherits GPU_BENCH_STAGE: killing
  # by it afterwards leaves nothing of the stage holding the GPU and spares a stage running beside
  # it on another GPU.
  local tag="$label-$$-$RANDOM"
  GPU_BENCH_STAGE=$tag timeout -k 5 "$limit" "${B[@]}" --label "$label" --out "$OUT/$label" "$@" > "$OUT/$label.log" 2>&1
  echo "=== $label: exit $? at $(date +%T)"; tail -3 "$OUT/$label.log"
  local left; left=$(grep -lz "^GPU_BENCH_STAGE=$tag\$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3)
  [ -n "$left" ] && kill -9 $left 2>/dev/null && sleep 5
  cp "$OUT/$label/bench.json" "$OUT/$label.json" 2>/dev/null
  if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$OUT" .; fi
}
warm_root() {  # real-size weights on a warm cache root: the last empty-root boot's, or one filled here
  real_weights
  local root; root=$(ls -d /tmp/vllm-cache-empty-* 2>/dev/null | tail -1)
  export VLLM_CACHE_ROOT=${root:-/tmp/vllm-cache-ab} MODEL_NAME=$R LOAD_FORMAT=auto
  [ -d $VLLM_CACHE_ROOT ] || run cold-ab-fill --parts coldstart_handler
}
lever_boots() {  # label prefix: warm boots with fewer CUDA-graph sizes, then without the graph memory estimate
  MODEL_NAME=$R LOAD_FORMAT=auto MAX_NUM_SEQS=16 run "$1-seqs16" --parts coldstart_handler
  MODEL_NAME=$R LOAD_FORMAT=auto VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 run "$1-noest" --parts coldstart_handler
}
for stage in "$@"; do
  case $stage in
    overhead) run bf16 --parts overhead,roofline --concurrency 1,8,64,256 --repeats 3 ;;
    ceiling) MAX_NUM_SEQS=512 MAX_QUEUE_DEPTH=512 run ceiling --parts overhead,roofline \
      --concurrency "${CEILING_CONCURRENCY:-256,512}" --repeats 3 ;;
    overhead-ids) run bf16-ids --parts overhead --concurrency 64,256 --repeats 3 --raw-input ids ;;
    fp8) QUANTIZATION=fp8 run fp8 --parts overhead,roofline --concurrency 1,64,256 --repeats 3 ;;
    fp8-si8) QUANTIZATION=fp8 STREAM_INTERVAL=8 run fp8-si8 --parts overhead --concurrency 1,64,256 --repeats 3 ;;
    quant) bash scripts/gpu_bench.sh quant-marlin quant-machete ;;
    quant-marlin | quant-machete)
      MODEL_NAME=$M-awq AWQ_KERNEL=${stage#quant-} run "awq-${stage#quant-}" --parts overhead,roofline \
        --concurrency 1,256 --repeats "${QUANT_REPEATS:-3}" ;;
    pod-spawn) VLLM_WORKER_MULTIPROC_METHOD=spawn run pod-spawn --parts pod --concurrency "${POD_CONCURRENCY:-1,8,64,256}" \
      --repeats 3 ;;
    pod-profile)
      POD_BENCH_PY_SPY=${PY_SPY:?PY_SPY must name a py-spy binary} run pod-profile --parts pod --concurrency 1,64 \
        --repeats 2 ;;
    pod-api-servers)
      for n in ${API_SERVERS:-2 1}; do
        MAX_NUM_SEQS=512 MAX_QUEUE_DEPTH=512 API_SERVER_COUNT=$n run "pod-api$n" --parts pod \
          --concurrency "${POD_CONCURRENCY:-64,256,512}" --repeats "${POD_REPEATS:-3}"
      done ;;
    pod-api2-vs-vllm1)
      MAX_NUM_SEQS=512 MAX_QUEUE_DEPTH=512 API_SERVER_COUNT=2 POD_BENCH_BASELINE=vllm1 run pod-api2-vs-vllm1 --parts pod \
        --concurrency "${POD_CONCURRENCY:-256,512}" --repeats "${POD_REPEATS:-3}" ;;
    pod-api2-vs-1)
      MAX_NUM_SEQS=512 MAX_QUEUE_DEPTH=512 API_SERVER_COUNT=2 POD_BENCH_BASELINE=pod1 run pod-api2-vs-1 --parts pod \
        --concurrency "${POD_CONCURRENCY:-1,8}" --repeats "${POD_REPEATS:-3}" ;;
    pod) run pod --parts pod --concurrency "${POD_CONCURRENCY:-1,8,64,256}" --repeats "${POD_REPEATS:-3}" ;;
    pod-spec)
      # The pod against vLLM's server, both speculating with $POD_SPEC (a spec-map configuration,
      # DRAFTER:K:LENGTH, static: worker/tools/bench/spec_map.py) with the same API process count.
      spec=$(python3 -c "import json, sys; from worker.tools.bench.spec_map_config import speculative_config as s
d, k, length = sys.argv[1].rsplit(':', 2); print(json.dumps(s(d, int(k), length)))" "${POD_SPEC:-$M-1b:3:2.5}") || exit 2
      ( unset SPECULATIVE_METHOD; export SPECULATIVE_CONFIG=$spec SPECULATION_CONTROL=static; run pod-spec --parts pod \
        --concurrency "${POD_CONCURRENCY:-1,8,32,64,128,256}" --repeats "${POD_REPEATS:-2}" ) ;;
    coldstart)
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-$$
      run cold-fresh-cache --parts coldstart_handler
      run cold-warm-cache --parts coldstart
      ENFORCE_EAGER=true run cold-eager --parts coldstart_handler ;;
    coldstart-server) run cold-server --parts coldstart ;;
    coldstart-levers)
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-levers-$$
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-real-fresh --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-real-warm --parts coldstart
      MODEL_NAME=$R LOAD_FORMAT=auto ENFORCE_EAGER=true run cold-real-eager --parts coldstart_handler
      lever_boots cold-real ;;
    coldstart-loaders)
      # Needs the loaders' wheels unpacked into /tmp/extra (scripts/unpack_wheels.py, see the header).
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-loaders-$$ PYTHONPATH=$PYTHONPATH:/tmp/extra
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-load-fill --parts coldstart_handler
      for format in auto fastsafetensors runai_streamer instanttensor; do
        MODEL_NAME=$R LOAD_FORMAT=$format run cold-load-$format --parts coldstart_handler
      done ;;
    coldstart-levers-v1)
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-levers-v1-$$
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-lv1-fill --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-lv1-warm --parts coldstart_handler
      lever_boots cold-lv1 ;;
    coldstart-fresh-home)
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-fresh-$$
      MODEL_NAME=$R LOAD_FORMAT=auto HOME=/tmp/home-fill-$$ run cold-fresh-fill --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto HOME=/tmp/home-new-$$ run cold-fresh-home --parts coldstart_handler ;;
    coldstart-container)
      # A fresh container on a warm cache root: after a boot that fills an empty one, a boot with an
      # empty HOME and an empty TMPDIR (inductor's default cache is under the temp folder), then one
      # with the fill's HOME and TMPDIR (every cache warm). Dummy weights: caches, not bytes.
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-ctr-$$
      for l in fill fresh warm; do
        h=/tmp/ctr-$l-$$
        [ $l = warm ] && h=/tmp/ctr-fill-$$
        mkdir -p $h/home $h/tmp
        HOME=$h/home TMPDIR=$h/tmp run cold-container-$l --parts coldstart_handler
      done ;;
    coldstart-plan | coldstart-seqs16)
      # Fresh containers (an empty HOME and TMPDIR each) on one warm cache root, dummy weights: after
      # a boot that fills the root (skipped when a call before filled it), coldstart-plan boots once
      # with vLLM's startup plan to write it, then alternates it off / on ($PLAN_ROUNDS, default "1 2");
      # coldstart-seqs16 boots MAX_NUM_SEQS=16 (fewer CUDA-graph sizes: a configuration of its own,
      # compiled first) in two fresh containers.
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-plan
      fresh() { local h=/tmp/ctr-plan-$1-$$; shift; mkdir -p $h/home $h/tmp; HOME=$h/home TMPDIR=$h/tmp "$@"; }
      [ -d $VLLM_CACHE_ROOT ] || fresh fill run cold-plan-fill --parts coldstart_handler
      if [ $stage = coldstart-plan ]; then
        VLLM_ENABLE_STARTUP_PLAN=true fresh write run cold-plan-write --parts coldstart_handler
        for i in ${PLAN_ROUNDS:-1 2}; do
          VLLM_ENABLE_STARTUP_PLAN=false fresh off$i run cold-plan-off-$i --parts coldstart_handler
          VLLM_ENABLE_STARTUP_PLAN=true fresh on$i run cold-plan-on-$i --parts coldstart_handler
        done
      else
        for l in fill 1 2; do MAX_NUM_SEQS=16 fresh s16-$l run cold-seqs16-$l --parts coldstart_handler; done
      fi ;;
    coldstart-triton-ab)
      # What the TRITON_CACHE_DIR default changed, on one cache root: after a boot that fills it,
      # boots in fresh containers (each its own empty HOME) alternate between the worker's default
      # (Triton's cache beside the compile cache) and the old behaviour (Triton's cache in HOME).
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-tab-$$
      MODEL_NAME=$R LOAD_FORMAT=auto HOME=/tmp/home-tab-fill-$$ run cold-tab-fill --parts coldstart_handler
      for i in 1 2 3 4; do
        h=/tmp/home-tab-$i-$$
        if [ $((i % 2)) = 1 ]; then
          MODEL_NAME=$R LOAD_FORMAT=auto HOME=$h run cold-tab-$i-new --parts coldstart_handler
        else
          MODEL_NAME=$R LOAD_FORMAT=auto HOME=$h TRITON_CACHE_DIR=$h/.triton/cache run cold-tab-$i-old \
            --parts coldstart_handler
        fi
      done ;;
    coldstart-disk)
      # Weights from a cold disk: after a boot that fills an empty cache root (skipped when a call before
      # this one on the same machine filled it), rounds of a boot with the weights evicted from the page
      # cache and PREFETCH_WEIGHTS=false, then the same with it on ($DISK_ROUNDS, default "1 2 3"), then
      # boots with the weights in the page cache ($CACHE_ROUNDS, default "1"); residency checked before each.
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-disk MODEL_NAME=$R LOAD_FORMAT=auto
      [ -d $VLLM_CACHE_ROOT ] || run cold-disk-fill --parts coldstart_handler
      for i in ${DISK_ROUNDS:-1 2 3}; do
        for p in false true; do
          python3 scripts/page_cache.py evict $R > "$OUT/cold-disk-$i-$p.residency"
          PREFETCH_WEIGHTS=$p run cold-disk-$i-$p --parts coldstart_handler
        done
      done
      for i in ${CACHE_ROUNDS:-1}; do
        python3 scripts/page_cache.py residency $R > "$OUT/cold-cache-$i.residency"
        run cold-cache-$i --parts coldstart_handler
      done ;;
    coldstart-beside)
      # The handler and vLLM's own server (its defaults for the rest, its own cache root) booted one after the
      # other in each case, real-size weights: both roots empty (each fills its own), then rounds
      # ($BESIDE_ROUNDS, default "1 2 3") of the weights evicted before each boot (cold disk, the handler with
      # its default PREFETCH_WEIGHTS) and in the page cache. A later call on the same machine skips the fill.
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-beside COLDSTART_SERVER_CACHE_ROOT=/tmp/vllm-cache-beside-srv
      export MODEL_NAME=$R LOAD_FORMAT=auto
      [ -d $VLLM_CACHE_ROOT ] || run cold-beside-fill --parts coldstart
      for i in ${BESIDE_ROUNDS-1 2 3}; do
        COLDSTART_EVICT_WEIGHTS=1 run cold-beside-disk-$i --parts coldstart
        run cold-beside-cache-$i --parts coldstart
      done ;;
    coldstart-graphs)
      # The serverless defaults (CUDAGRAPH_MODE=auto: vLLM's FULL_AND_PIECEWISE; FULL_DECODE_ONLY when this
      # stage was written for issue 50, so its files cold-new-* are that mode) against vLLM's own server
      # with the same engine arguments (vLLM's CUDA-graph defaults, its own cache root), real-size weights,
      # MAX_NUM_SEQS=128 (the handler's own default, vLLM's library one). $GRAPHS_PLAN, in order (default
      # "fill cache-1 fpfill fp-1 disk-1 fp-2"): fill (both roots empty), cache-N / disk-N (a handler boot
      # and a server boot, the weights in the page cache / evicted before each), hfill (the handler alone on
      # the empty root), hcache-N / hdisk-N (the handler alone), fpfill then fp-N (the handler with
      # CUDAGRAPH_MODE=$GRAPHS_ALT, default FULL_DECODE_ONLY: the other mode, compiled once on the same root;
      # its files were FULL_AND_PIECEWISE while that was the other), mt or mt-N (the default with vLLM's
      # multithreaded weight loader, 8 threads, the weights in the page cache), decode (the handler and
      # AsyncLLM at 1, 8, 64 streams, both modes).
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-new COLDSTART_SERVER_CACHE_ROOT=/tmp/vllm-cache-new-srv
      export MODEL_NAME=$R LOAD_FORMAT=auto MAX_NUM_SEQS=128
      FP=${GRAPHS_ALT:-FULL_DECODE_ONLY}
      MT='{"model_loader_extra_config": {"enable_multithread_load": true, "num_threads": 8}}'
      for step in ${GRAPHS_PLAN:-fill cache-1 fpfill fp-1 disk-1 fp-2}; do
        case $step in
          fill) RUN_MIN_S=240 run cold-new-fill --parts coldstart ;;
          hfill) RUN_MIN_S=120 run cold-new-hfill --parts coldstart_handler ;;
          cache-*) RUN_MIN_S=85 run cold-new-$step --parts coldstart ;;
          disk-*) COLDSTART_EVICT_WEIGHTS=1 RUN_MIN_S=105 run cold-new-$step --parts coldstart ;;
          hcache-*) RUN_MIN_S=35 run cold-new-$step --parts coldstart_handler ;;
          hdisk-*) COLDSTART_EVICT_WEIGHTS=1 RUN_MIN_S=40 run cold-new-$step --parts coldstart_handler ;;
          fpfill) CUDAGRAPH_MODE=$FP RUN_MIN_S=70 run cold-fp-fill --parts coldstart_handler ;;
          fp-*) CUDAGRAPH_MODE=$FP RUN_MIN_S=35 run cold-$step --parts coldstart_handler ;;
          mt | mt-*) ENGINE_ARGS=$MT RUN_MIN_S=35 run cold-$step --parts coldstart_handler ;;
          decode)
            for m in auto $FP; do
              CUDAGRAPH_MODE=$m RUN_MIN_S=60 run decode-graphs-$m --parts overhead --concurrency 1,8,64 --repeats 1
            done ;;
          *) echo "unknown step $step"; exit 2 ;;
        esac
      done ;;
    coldstart-defaults)
      # Issue 50's "done when": every case three times with the serverless defaults of today, vLLM's own server
      # (the same engine arguments, its own cache root) booted after the handler in each, real-size weights,
      # MAX_NUM_SEQS=128. $DEFAULTS_PLAN, in order: empty-N (both cache roots new, the weights in the page
      # cache; the steps after it use these roots; roots-N picks them again in a later call), disk-N (the
      # weights evicted before each boot), cache-N.
      # Several of these stages can run at once, one per GPU, each with its own CUDA_VISIBLE_DEVICES, OUT,
      # ARCHIVE and REAL_WEIGHTS_DIR. BENCH_END (epoch seconds) bounds the call.
      PLAN=${DEFAULTS_PLAN:-empty-1 disk-1 cache-1}
      for step in $PLAN; do  # a bad step name stops the stage before it boots anything
        case $step in empty-[0-9]* | roots-[0-9]* | disk-[0-9]* | cache-[0-9]* | h*-[0-9]*) ;; *) echo "unknown step $step"; exit 2 ;; esac
      done
      read -r MIN_EMPTY MIN_DISK MIN_CACHE EXTRA <<< "${DEFAULTS_MIN_S:-160 95 100}"
      if ! [[ "$MIN_EMPTY $MIN_DISK $MIN_CACHE${EXTRA:+ $EXTRA}" =~ ^[0-9]+\ [0-9]+\ [0-9]+$ ]]; then
        echo "DEFAULTS_MIN_S: three whole seconds, empty disk cache"; exit 2
      fi
      real_weights
      export MODEL_NAME=$R LOAD_FORMAT=auto MAX_NUM_SEQS=128
      for step in $PLAN; do
        case $step in
          empty-[0-9]* | roots-[0-9]*)  # roots-N: the roots empty-N filled (an earlier call), no boot
            export VLLM_CACHE_ROOT=/tmp/vllm-cache-def-${step#*-} COLDSTART_SERVER_CACHE_ROOT=/tmp/vllm-cache-def-${step#*-}-srv
            case $step in empty-*) RUN_MIN_S=$MIN_EMPTY run cold-def-$step --parts coldstart ;; esac ;;
          # The pairs took 283 s (empty root), 188 s (cold disk) and ~160 s (page cache) on an H200 with
          # 0.32's compiled default; about 130, 65 and 75 s on an H100 with 0.34's compile-free one. The
          # guard (seconds a pair needs) is 0.34's with a margin; DEFAULTS_MIN_S="empty disk cache" sets it.
          disk-*) COLDSTART_EVICT_WEIGHTS=1 RUN_MIN_S=$MIN_DISK run cold-def-$step --parts coldstart ;;
          cache-*) cat $R/*.safetensors > /dev/null; RUN_MIN_S=$MIN_CACHE run cold-def-$step --parts coldstart ;;
          # The handler alone (no server beside it): hempty-N on a new root of its own, hdisk-N / hcache-N
          # on the roots of the last empty-N or roots-N.
          hempty-*) VLLM_CACHE_ROOT=/tmp/vllm-cache-def-$step RUN_MIN_S=120 run cold-def-$step --parts coldstart_handler ;;
          hdisk-*) COLDSTART_EVICT_WEIGHTS=1 RUN_MIN_S=60 run cold-def-$step --parts coldstart_handler ;;
          hcache-*) cat $R/*.safetensors > /dev/null; RUN_MIN_S=50 run cold-def-$step --parts coldstart_handler ;;
          *) echo "unknown step $step"; exit 2 ;;
        esac
      done ;;
    coldstart-first)
      # An endpoint's first worker without a network volume: each boot a fresh container (empty HOME and
      # TMPDIR) on a new cache root, the handler alone (vLLM's server beside it: coldstart-defaults' empty-N).
      # The stage's files name their step; their JSON's phase table reads as coldstart-defaults'.
      PLAN=${FIRST_PLAN:-fill empty-1 jit-1 seeded-1}
      for step in $PLAN; do  # a bad step name stops the stage before it boots anything
        case $step in fill | trim | empty-[0-9]* | jit-[0-9]* | seeded-[0-9]* | image-[0-9]*) ;; *) echo "unknown step $step"; exit 2 ;; esac
      done
      real_weights
      export MODEL_NAME=$R LOAD_FORMAT=auto MAX_NUM_SEQS=128
      F=/tmp/cold-first-$$
      first() {  # label, then NAME=value for the boot: a fresh container on a root of its own
        local label=$1; shift
        mkdir -p $F/$label/home $F/$label/tmp
        cat $R/*.safetensors > /dev/null
        ( export HOME=$F/$label/home TMPDIR=$F/$label/tmp VLLM_CACHE_ROOT=$F/$label/root "$@"
          RUN_MIN_S=120 run cold-first-$label --parts coldstart_handler )
      }
      for step in $PLAN; do
        case $step in
          fill) first fill ;;
          empty-*) first $step ;;
          jit-*) first $step VLLM_TRITON_JIT_WARMUP_NUM_THREADS=${FIRST_JIT_THREADS:-$(nproc)} ;;
          seeded-* | image-*)
            # The Triton cache of a fill here, of an earlier call's, or of coldstart-defaults' empty-1 (the
            # same model and settings on this card). seeded-N points Triton at a copy of it; image-N gives
            # the worker a copy of that boot's whole cache root as CACHE_SEED (the image's /opt/cache-seed):
            # the worker copies it into the new, empty root at boot, the image's own path.
            seed=
            for candidate in $F/fill/root/triton_cache /tmp/cold-first-*/fill/root/triton_cache \
                /tmp/vllm-cache-def-1/triton_cache; do  # in this order: the first that exists
              if [ -d "$candidate" ]; then seed=$candidate; break; fi
            done
            if [ -z "$seed" ]; then echo "=== cold-first-$step: skipped, no fill's Triton cache"; continue; fi
            rm -rf $F/$step-seed
            case $step in
              seeded-*) cp -r "$seed" $F/$step-seed && first $step TRITON_CACHE_DIR=$F/$step-seed ;;
              image-*) cp -r "$(dirname "$seed")" $F/$step-seed && first $step CACHE_SEED=$F/$step-seed ;;
            esac ;;
          trim)
            python3 -X importtime -c "import worker.boot.launch" 2> "$OUT/importtime-before-trim.txt"
            PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip uninstall -y -r scripts/image_trim.txt > "$OUT/trim.log" 2>&1
            python3 -X importtime -c "import worker.boot.launch" 2> "$OUT/importtime-after-trim.txt"
            tail -n 1 "$OUT/importtime-before-trim.txt" "$OUT/importtime-after-trim.txt"; cat "$OUT/trim.log"
            # The RunPod SDK's import (not in the handler's local boots): py-cpuinfo's CPU timing in it.
            python3 -X importtime -c "import runpod" 2> "$OUT/importtime-runpod.txt"; tail -n 1 "$OUT/importtime-runpod.txt" ;;
        esac
      done ;;
    coldstart-empty)
      # The endpoint's first worker: an empty cache root of its own for every boot, the weights evicted
      # before it (a new host), PREFETCH_WEIGHTS on and off alternating ($EMPTY_ROUNDS, default "1 2 3").
      real_weights
      export MODEL_NAME=$R LOAD_FORMAT=auto COLDSTART_EVICT_WEIGHTS=1
      for i in ${EMPTY_ROUNDS:-1 2 3}; do
        for p in true false; do
          VLLM_CACHE_ROOT=/tmp/vllm-cache-empty-$i-$p PREFETCH_WEIGHTS=$p run cold-empty-$i-$p --parts coldstart_handler
        done
      done ;;
    coldstart-disk-ab)
      # Weights on a cold disk, warm cache root (the last empty-root boot's, or one filled here): evicted before
      # each boot (residency in the JSON), PREFETCH_WEIGHTS off and on alternating ($DISK_AB_ROUNDS, default "1 2 3").
      warm_root
      for i in ${DISK_AB_ROUNDS:-1 2 3}; do
        for p in false true; do
          COLDSTART_EVICT_WEIGHTS=1 PREFETCH_WEIGHTS=$p run cold-disk-$i-$p --parts coldstart_handler
        done
      done ;;
    coldstart-cache-ab)
      # Weights in the page cache, warm cache root (the last empty-root boot's, or one filled here):
      # PREFETCH_WEIGHTS off and on alternating ($CACHE_AB_ROUNDS, default "1 2 3"), residency recorded.
      unset COLDSTART_EVICT_WEIGHTS  # set by coldstart-empty when both stages run in one call
      warm_root
      for i in ${CACHE_AB_ROUNDS:-1 2 3}; do
        for p in false true; do
          cat $R/*.safetensors > /dev/null
          PREFETCH_WEIGHTS=$p run cold-cache-$i-$p --parts coldstart_handler
        done
      done ;;
    lossless)
      # The tiny models (built on first use, real weights): speculation at temperature 1, and 0.7 with
      # top-p 0.9, against an A/A control of the same engine without it (bench part lossless).
      ( unset LOAD_FORMAT MAX_MODEL_LEN; export MODEL_NAME=tiny:target
        run lossless --parts lossless --lossless-top-p --lossless-samples "${LOSSLESS_SAMPLES:-1000}" --concurrency 256 ) ;;
    coldstart-server-real)
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-srv-$$
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-srv-fill --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-srv-warm --parts coldstart ;;
    coldstart-jit)
      real_weights
      export VLLM_CACHE_ROOT=/tmp/vllm-cache-jit-$$
      for i in 1 2; do python3 -X importtime -c "import worker.engine" 2> "$OUT/importtime-$i.txt"; done
      NOJIT='{"kernel_config": {"enable_jit_warmup": false}}'
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-jit-fill --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto ENGINE_ARGS=$NOJIT run cold-jit-off --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto run cold-jit-on --parts coldstart_handler
      MODEL_NAME=$R LOAD_FORMAT=auto ENGINE_ARGS=$NOJIT run first-request-jit-off --parts first_request ;;
    spec) bash scripts/gpu_bench.sh spec-ngram spec-draft ;;
    spec-ngram) run spec-ngram --parts spec --drafts ngram --ks 2,4,8 --spec-requests 4 --spec-rounds "${SPEC_ROUNDS:-3}" ;;
    spec-draft) run spec-draft --parts spec --drafts $M,$M-1b --ks 4 --spec-requests 4 --spec-rounds "${SPEC_ROUNDS:-3}" ;;
    runner-ngram) bash scripts/gpu_bench.sh runner-ngram-spec runner-ngram-v2 ;;
    runner-ngram-spec) run spec-ngram-v2 --parts spec --drafts ngram --ks "${SPEC_KS:-2,4,8}" \
      --spec-requests 4 --spec-rounds "${SPEC_ROUNDS:-3}" ;;
    runner-ngram-v2)
      SPECULATIVE_METHOD=ngram NUM_SPECULATIVE_TOKENS=4 \
        run ngram4-v2 --parts overhead --concurrency 1,64,256 --repeats "${NGRAM_REPEATS:-1}" ;;
    compile-decode)  # $DECODE_CONCURRENCY and $DECODE_REPEATS narrow it to the runs a level still lacks
      LEVELS=(--parts overhead --concurrency "${DECODE_CONCURRENCY:-1,16,64,256}" --repeats "${DECODE_REPEATS:-3}")
      TORCH_COMPILE=on run bf16-compiled "${LEVELS[@]}"
      TORCH_COMPILE=off run bf16-graphs-only "${LEVELS[@]}" ;;
    eager-decode) ENFORCE_EAGER=true run bf16-eager --parts overhead --concurrency 1,64 --repeats 1 ;;
    first-request)
      run first-request --parts first_request
      WARMUP_REQUEST=false run first-request-no-warmup --parts first_request ;;
    ngram) run ngram --parts spec --drafts ngram --ks 4 --spec-requests 2 ;;
    spec-map)
      # worker/tools/bench/spec_map.py: each configuration an engine, side by side, alternating; synthetic
      # acceptance (vLLM's rejection_sample_method=synthetic) at mean length L. One 10-minute call.
      echo "=== spec-map: $(date +%T)"
      SPEC_MAP_ACCEPTANCE_MIX=${MAP_MIX:-} timeout -k 20 "${STAGE_TIMEOUT:-0}" python3 -m worker.tools.bench.spec_map --out "$OUT/spec-map" \
        --configs "${MAP_CONFIGS:-none,ngram_gpu:2:2.5:static,ngram:4:2.5:auto,ngram:4:1.0:auto}" \
        --concurrency "${MAP_CONCURRENCY:-1,8,32,64,128,256}" --max-tokens "${MAP_TOKENS:-128}" \
        --repeats "${MAP_REPEATS:-3}" --deadline-s "${MAP_DEADLINE_S:-400}" \
        --length-spread "${MAP_LENGTH_SPREAD:-0}" > "$OUT/spec-map.log" 2>&1
      echo "=== spec-map: exit $? at $(date +%T)"; grep "^spec_map" "$OUT/spec-map.log" | tail -40
      if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$OUT" .; fi ;;
    stats-ngram)
      SPECULATIVE_METHOD=ngram NUM_SPECULATIVE_TOKENS=4 run stats-ngram4 --parts overhead \
        --concurrency 1,8,64,256 --repeats 3 --stats-off-baseline ;;
    stats-path)
      SPECULATIVE_METHOD=ngram NUM_SPECULATIVE_TOKENS=4 run stats-path --parts overhead,stats_path \
        --concurrency 1,8,64,256 --repeats 1 ;;
    stats-path-procs)
      mkdir -p "$OUT/stats-path-procs"
      for i in $(seq "${STATS_PATH_PROCS:-5}"); do
        echo "=== stats-path-procs $i: $(date +%T)"
        python3 -c "import json, sys; from worker.tools.bench.stats_path import bench_stats_path
json.dump(bench_stats_path([${STATS_PATH_SIZES:-1,8,64,256}]), open(sys.argv[1], 'w'), indent=1)" \
          "$OUT/stats-path-procs/$i.json" || echo "=== stats-path-procs $i: failed"
        if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$OUT" .; fi
      done
      python3 -c "import glob, json, statistics, sys
runs = [json.load(open(f))['rows'] for f in sorted(glob.glob(sys.argv[1] + '/*.json'))]
for i, row in enumerate(runs[0]):
    for case in [c for c in row if c != 'batch']:
        totals = sorted(run[i][case]['total_us'] for run in runs)
        print(row['batch'], case, 'total us median %.1f of %d, range %.1f-%.1f' % (statistics.median(totals), len(totals), totals[0], totals[-1]))
" "$OUT/stats-path-procs" ;;
    stats-ngram-aa)
      SPECULATIVE_METHOD=ngram NUM_SPECULATIVE_TOKENS=4 run stats-ngram4-aa --parts overhead \
        --concurrency 1,8,64,256 --repeats 3 --stats-off-baseline --aa-baseline ;;
    stats-draft)
      # 64 tokens a request: with dummy weights the draft accepts nothing, so a token costs four
      # draft passes and a verify, and 128 tokens did not fit a 10-minute call.
      SPECULATIVE_METHOD=draft_model SPECULATIVE_MODEL=$M-1b NUM_SPECULATIVE_TOKENS=4 run stats-draft1b4 \
        --parts overhead --concurrency 1,8,64,256 --repeats 3 --stats-off-baseline --max-tokens 64 ;;
    tp2-70b | tp2-70b-fp8)
      q=bf16; [ $stage = tp2-70b-fp8 ] && q=fp8
      MODEL_NAME=/tmp/llama70b TENSOR_PARALLEL_SIZE=2 QUANTIZATION=${q/bf16/} SPECULATIVE_METHOD=ngram \
        NUM_SPECULATIVE_TOKENS=4 run $stage --parts overhead --concurrency 1,64,256 --repeats "${TP2_REPEATS:-3}" ;;
    tp2-8b) TENSOR_PARALLEL_SIZE=2 run tp2-8b --parts overhead --concurrency 1,256 --repeats 3 ;;
    tp2-faults)
      echo "=== tp2-faults: $(date +%T)"
      MODEL_NAME=/tmp/llama70b TENSOR_PARALLEL_SIZE=2 ENFORCE_EAGER=true SPECULATIVE_METHOD=ngram \
        NUM_SPECULATIVE_TOKENS=4 timeout -k 30 "${STAGE_TIMEOUT:-0}" python3 scripts/gpu_faults.py \
        "$OUT/faults.json" > "$OUT/tp2-faults.log" 2>&1
      echo "=== tp2-faults: exit $? at $(date +%T)"; grep -E "^(pod_|serverless_)" "$OUT/tp2-faults.log"
      if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$OUT" .; fi ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
