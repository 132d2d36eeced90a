"""Settings to vLLM engine keyword arguments: a pure function, testable without vLLM.

Model references stay as the user named them (``tiny:<variant>``, an unset ``MODEL_NAME`` for the
embedded tiny model, hub ids, paths); the boot plan resolves them after (``worker/boot/models.py``).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from worker.config import DeploymentMode, Settings
from worker.config.settings import PUBLIC_MEDIA_CONNECTOR
from worker.speculation.config import auto_schedule, drafts_by_ngram
from worker.speculation.decide import (
    full_graphs_for_joins,
    is_eager,
    model_runner_flag,
    runs_worker_scheduler,
    speculation_control,
)
from worker.vllm_internals.plugin import FULL_GRAPHS_ENV

__all__ = [
    "FULL_GRAPHS_CONFIG",
    "JOIN_CAPTURE_TOKENS",
    "PUBLIC_MEDIA_CONNECTOR",
    "TINY_KV_CACHE_BYTES",
    "TINY_MAX_MODEL_LEN",
    "build_engine_kwargs",
    "compilation_config",
    "engine_environment",
    "lora_slots",
    "start_method",
]

TINY_MAX_MODEL_LEN = 1024
TINY_KV_CACHE_BYTES = 256 * 2**20
# The largest step (tokens) given a full CUDA graph where n-gram runs under auto with FULL graphs:
# 256 sequences at k = 3, or 128 at k = 4 with prompts joining, where vLLM's own bound on Hopper,
# min(2 * max_num_seqs * (1 + k), 512), leaves such steps without a graph. As measured on the H200.
JOIN_CAPTURE_TOKENS = 1024

# In vLLM's config (``additional_config``, part of its hash) where the worker chose FULL: the
# worker's plugin then captures vLLM's decode graphs beside FULL's (``worker.vllm_plugin``), which
# vLLM's config does not show, and vLLM keys by that hash the startup plan a later boot reuses (its
# KV cache reserved without measuring the graphs' memory) and the compile cache.
FULL_GRAPHS_CONFIG = {"runpod_worker_cuda_graphs": "FULL, and decode graphs beside"}


def build_engine_kwargs(
    settings: Settings, *, is_cpu: bool = False, mode: DeploymentMode = "serverless"
) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` keyword arguments, model references as the user named them (the
    boot plan resolves them: ``worker.boot.models.resolve_references``). Unset settings keep
    vLLM's defaults. ``is_cpu``: the engine runs on vLLM's CPU build (``lora_slots``,
    ``compilation_config``)."""
    is_tiny = settings.is_tiny_default
    eager = is_eager(settings)
    spec = settings.resolved_speculative_config
    kwargs: dict[str, Any] = {
        "model": settings.target_ref,
        # The name the OpenAI routes answer to, as vLLM's server passes it: the model_name label of
        # vLLM's own metrics (vllm:*), which otherwise shows the resolved path.
        "served_model_name": settings.served_model_name,
        "revision": settings.model_revision,
        "tokenizer": settings.tokenizer_name,
        "tokenizer_revision": settings.tokenizer_revision,
        "dtype": settings.dtype,
        "quantization": settings.quantization,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "load_format": settings.load_format,
        "trust_remote_code": settings.trust_remote_code,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "enforce_eager": eager,
        "seed": settings.seed,
        "max_model_len": settings.max_model_len or (TINY_MAX_MODEL_LEN if is_tiny else None),
        "kv_cache_memory_bytes": settings.kv_cache_memory_bytes or (TINY_KV_CACHE_BYTES if is_tiny else None),
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "stream_interval": settings.stream_interval,
        "disable_log_stats": False,
        "structured_outputs_config": {
            "backend": settings.structured_outputs_backend,
            "disable_any_whitespace": settings.structured_outputs_disable_any_whitespace,
            **({"reasoning_parser": settings.reasoning_parser} if settings.reasoning_parser else {}),
        },
        "enable_lora": settings.enable_lora or None,
        "max_loras": lora_slots(settings, is_cpu=is_cpu),
        "max_lora_rank": settings.max_lora_rank,
        "allowed_media_domains": settings.allowed_media_domains,
        # Eager engines (the CPU build, the tiny models) capture no CUDA graphs.
        "compilation_config": None if is_cpu or eager else compilation_config(settings, spec, mode=mode),
        # The worker's plugin captures more graphs under the FULL it chose; vLLM's config says so.
        "additional_config": FULL_GRAPHS_CONFIG if full_graphs_for_joins(settings, mode=mode, is_cpu=is_cpu) else None,
    }
    if spec is not None:
        on_v2 = not is_cpu and model_runner_flag(settings, mode=mode, is_cpu=is_cpu) == "1"
        if drafts_by_ngram(spec) and on_v2:
            # vLLM's V2 runner drafts both n-gram names with its GPU proposer (NgramGPUSpeculator),
            # but vLLM 0.32 keeps async scheduling only for the name ngram_gpu: under "ngram" every
            # step waits for the host. On an H200 (8B, V2, auto, 0% acceptance: speculation off) a
            # step took 6.4 ms under "ngram" against 4.9 without speculation at one stream, 11.6 against
            # 7.2 at 128; as ngram_gpu 4.85 and 7.14. At 2.5 accepted a step, auto went from 1.72x to
            # 2.40x no speculation at one stream, 1.20x to 1.74x at 64 (docs/gpu-results/HISTORY.md). Not on V1,
            # whose own GPU proposer takes the name too: static k = 2 as ngram_gpu on V1 ran 1.37x at one
            # stream (8.74 ms a step) against 2.38x on V2 (5.19 ms), and V1's "ngram" 1.50x.
            spec = {key: value for key, value in spec.items() if key != "model"} | {"method": "ngram_gpu"}
        k = spec.get("num_speculative_tokens")
        if speculation_control(settings, mode=mode, is_cpu=is_cpu) == "auto" and isinstance(k, int) and k > 0:
            # vLLM's batch-size schedule is what lets k change per step; the worker's scheduler then
            # answers its lookups (worker/speculation/controller.py). On V1: one range, the configured k. Where the
            # worker chose V2 (n-gram or EAGLE under auto) or the user did: every k from the configured one to 0,
            # so that V2 captures full graphs for each, which only the controller reads as such (vLLM
            # itself would run 0 from k + 1 sequences on): not where no controller runs. vLLM's own
            # choice of V2 (a pod) keeps one k, as before, since vLLM may fall back to V1 for some drafters.
            schedule = auto_schedule(k, on_v2=on_v2 and runs_worker_scheduler(settings))
            spec.setdefault("num_speculative_tokens_per_batch_size", schedule)
        kwargs["speculative_config"] = spec
        kwargs["per_request_spec_decode_metrics"] = settings.per_request_spec_decode_metrics
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    # ENGINE_ARGS, the escape hatch, has the last word (its keys are checked against vLLM's at boot).
    return {**kwargs, **(settings.engine_args or {})}


def compilation_config(
    settings: Settings, spec: dict[str, Any] | None, *, mode: DeploymentMode
) -> dict[str, Any] | None:
    """vLLM's CUDA-graph choices (``CUDAGRAPH_MODE``, ``MAX_CUDAGRAPH_CAPTURE_SIZE``); None: vLLM's own.

    ``CUDAGRAPH_MODE=auto`` keeps vLLM's mode, FULL_AND_PIECEWISE: full graphs for decode batches
    up to ``max_num_seqs``, piecewise graphs for mixed prefill-decode batches up to twice that.
    FULL_DECODE_ONLY drops the latter (steps that carry a prompt run compiled, without a graph).
    On an H200 (8B, 128 sequences, vLLM 0.32) it captured in 1.0-1.6 s against 3.6-3.8 s, but
    decoded 4.5% and 3.2% slower at 8 and 64 streams (the same at one), past issue 50's bound of 3%;
    and vLLM graphs a draft model or head only in a piecewise mode, so under it a drafter runs
    eagerly (docs/benchmarks.md). Hence vLLM's mode by default; FULL_DECODE_ONLY is a setting. The
    exception: n-gram under ``SPECULATION_CONTROL=auto`` on V2 runs FULL, a full graph for steps
    that carry prompts too, up to ``JOIN_CAPTURE_TOKENS`` (``runner.full_graphs_for_joins``), and
    vLLM's decode graphs beside them (the worker's plugin, ``worker.vllm_plugin``).
    Under a mode without piecewise graphs (FULL_DECODE_ONLY, FULL) serverless captures no decode
    batch larger than its traffic runs: ``MAX_CONCURRENCY``, the jobs a worker takes at once, bounds
    it, so no graph past it is replayed. vLLM's capture sizes count tokens and serve its piecewise
    graphs too, so under vLLM's mode the cap would leave larger prompt-carrying steps without a
    graph: no cap there, nor with speculation (``1 + k`` tokens a sequence, sized by vLLM itself).
    """
    cudagraph_mode = None if settings.cudagraph_mode == "auto" else settings.cudagraph_mode
    capture = settings.max_cudagraph_capture_size
    if full_graphs_for_joins(settings, mode=mode):
        # n-gram under auto on V2: FULL, and graphs up to JOIN_CAPTURE_TOKENS (runner.full_graphs_for_joins).
        cudagraph_mode, capture = "FULL", capture or JOIN_CAPTURE_TOKENS
    if capture is None and mode == "serverless" and spec is None and cudagraph_mode in ("FULL_DECODE_ONLY", "FULL"):
        capture = settings.max_concurrency
    config = {"cudagraph_mode": cudagraph_mode, "max_cudagraph_capture_size": capture}
    return {key: value for key, value in config.items() if value is not None} or None


def lora_slots(settings: Settings, *, is_cpu: bool) -> int | None:
    """vLLM's ``max_loras``: ``MAX_LORAS``, and on the CPU build one slot more than any adapter can fill.

    vLLM 0.32's CPU LoRA ops (``PunicaWrapperCPU`` over ``lora/ops/torch_ops``) index the stacked
    adapter weights with each token's slot, and a token without an adapter has slot -1, which
    Python indexing turns into the last slot (vllm-project/vllm#48421, open). So in a batch that
    mixes base-model and adapter requests, the base-model rows get the last slot's adapter added:
    found by the soak (``python -m worker soak``), where base-model answers came back as the
    tiny adapter's text whenever an adapter request ran beside them. vLLM fills the first free
    slot and the worker loads only ``LORA_MODULES``, so with more slots than adapters the last
    slot stays zero and -1 reads nothing. (Adapters loaded at run time through vLLM's
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` routes could still fill it.) GPUs use vLLM's Triton
    kernels, which skip slot -1: nothing changes there.
    """
    if not (is_cpu and settings.enable_lora):
        return settings.max_loras
    return max(settings.max_loras or 1, len(settings.lora_modules)) + 1


def engine_environment(settings: Settings, *, mode: DeploymentMode, is_cpu: bool = False) -> dict[str, str | None]:
    """Process environment vLLM must see before the engine starts (``None``: unset it); the
    engine-core process inherits it. Applied by ``worker.runtime.boot_engine``.

    The 4-bit GEMM kernel on Hopper (``AWQ_KERNEL``), measured on an H200 with an 8B AWQ model on
    vLLM 0.32 (docs/benchmarks.md): Machete, vLLM's default there, was 17% slower than Marlin at
    batch 1 (254 vs 306 tok/s) and 43% faster at batch 256 (23,573 vs 16,518 tok/s). Serverless
    traffic is latency-bound (small batches): Marlin; pods run large batches: Machete.
    """
    kernel = settings.awq_kernel
    if kernel == "auto":
        kernel = "marlin" if mode == "serverless" else "machete"
    disabled = [k for k in (settings.vllm_disabled_kernels or "").split(",") if k and k != "MacheteLinearKernel"]
    if kernel == "marlin":
        disabled.append("MacheteLinearKernel")
    return {
        "VLLM_DISABLED_KERNELS": ",".join(disabled) or None,
        "VLLM_USE_V2_MODEL_RUNNER": model_runner_flag(settings, mode=mode, is_cpu=is_cpu),
        # FULL chosen by default: the worker's vLLM plugin keeps vLLM's fallback for backends without full graphs.
        FULL_GRAPHS_ENV: "1" if full_graphs_for_joins(settings, mode=mode, is_cpu=is_cpu) else None,
        "VLLM_WORKER_MULTIPROC_METHOD": start_method(settings, mode=mode),
        "TRITON_CACHE_DIR": _triton_cache_dir(settings),
        # vLLM's startup plan (off in vLLM, on here): a boot keeps the memory profile's result under
        # VLLM_CACHE_ROOT, keyed by the configuration, GPU and library versions, and a later boot
        # that matches (and finds as much free memory) reserves that KV cache without measuring.
        # On an H200 (8B, V1, fresh containers on a warm cache root) the profile phase took 0.7-0.8 s
        # instead of 2.5-2.6 s, the KV cache 0.6% smaller (docs/benchmarks.md). vLLM falls back to
        # profiling on any mismatch. Written as "1"/"0": vLLM parses its variable as an int.
        "VLLM_ENABLE_STARTUP_PLAN": "1" if settings.vllm_enable_startup_plan else "0",
        # Media URLs (worker/media.py): public addresses only, no redirects; or vLLM's own connector.
        "VLLM_MEDIA_CONNECTOR": None if settings.allow_private_media_urls else PUBLIC_MEDIA_CONNECTOR,
    }


def start_method(settings: Settings, *, mode: DeploymentMode) -> Literal["fork", "spawn"]:
    """How vLLM starts its engine core (and, on a CPU, its model worker): ``fork`` or ``spawn``.

    vLLM's own server starts its engine core with spawn (its CLI sets this); the library default
    on a GPU is fork. On an H200 the pod with a forked engine core answered the first token of one
    stream later than vLLM's server in all 8 paired runs (+0.6 to +4.9 ms); spawned, the pairs split
    both ways, median +0.3 ms over 14 (docs/benchmarks.md): pods spawn. Serverless forks: no
    re-import, a shorter boot. vLLM still spawns where fork is unsafe (CUDA already initialised in
    the process). vLLM's CPU platform sets spawn whatever was asked while it builds its config;
    the boot plan's environment is applied again after it (``worker.boot.launch.build_config``):
    a spawned process imports vLLM again, twice per
    engine on a CPU (engine core, model worker), and the tiny model's boot took 30 s spawned
    against 9 s forked on 2 cores.
    """
    return settings.vllm_worker_multiproc_method or ("spawn" if mode == "pod" else "fork")


def _triton_cache_dir(settings: Settings) -> str | None:
    """Triton's kernel cache, kept with vLLM's compile cache (on RunPod: the network volume).

    vLLM points Triton at a folder of its compile cache only while it compiles; a boot that loads
    the compiled graphs from that cache leaves Triton at its default, ``~/.triton/cache``, which a
    fresh container does not have. On an H200 (V1 runner, 8B, one warm cache root) fresh
    containers booted in 26.6-28.6 s with this folder and in 43.5-54.5 s without it, re-running
    V1's kernel JIT warm-up (docs/benchmarks.md). Naming the folder makes both kinds of boot
    share one cache.
    """
    if settings.triton_cache_dir is not None:
        return settings.triton_cache_dir
    if settings.vllm_cache_root is None:
        return None  # Triton's own default, which persists wherever vLLM's default cache does
    return os.path.join(os.path.expanduser(settings.vllm_cache_root), "triton_cache")
