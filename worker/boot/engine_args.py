"""Settings to vLLM engine keyword arguments: a pure function, testable without vLLM.

Model references stay as the user named them (``tiny:<variant>``, an unset ``MODEL_NAME`` for the
embedded tiny model, hub ids, paths); the boot plan resolves them after (``worker/boot/models.py``).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Literal

from worker.config import DeploymentMode, Settings
from worker.config.settings import PUBLIC_MEDIA_CONNECTOR
from worker.speculation.decide import SpeculationPlan
from worker.vllm_internals.plugin import DRAFT_SKIP_ENV, FULL_GRAPHS_ENV
from worker.vllm_internals.runner import runner_environment

__all__ = [
    "FULL_GRAPHS_CONFIG",
    "PUBLIC_MEDIA_CONNECTOR",
    "TINY_KV_CACHE_BYTES",
    "TINY_MAX_MODEL_LEN",
    "build_engine_kwargs",
    "engine_environment",
    "lora_slots",
    "start_method",
]

TINY_MAX_MODEL_LEN = 1024
TINY_KV_CACHE_BYTES = 256 * 2**20
# In vLLM's config (``additional_config``, part of its hash) where the worker chose FULL: the
# worker's plugin then captures vLLM's decode graphs beside FULL's (``worker.vllm_internals.plugin``), which
# vLLM's config does not show, and vLLM keys by that hash the startup plan a later boot reuses (its
# KV cache reserved without measuring the graphs' memory) and the compile cache.
FULL_GRAPHS_CONFIG = {"runpod_worker_cuda_graphs": "FULL, and decode graphs beside"}


def build_engine_kwargs(settings: Settings, speculation: SpeculationPlan, *, is_cpu: bool = False) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` keyword arguments, model references as the user named them (the
    boot plan resolves them: ``worker.boot.models.resolve_references``), speculation and CUDA
    graphs as ``speculation`` decided them. Unset settings keep vLLM's defaults. ``ENGINE_ARGS`` has
    the last word, its ``compilation_config`` key by key over the plan's. ``is_cpu``: the
    engine runs on vLLM's CPU build (``lora_slots``)."""
    is_tiny = settings.is_tiny_default
    spec = speculation.speculative_config
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
        "enforce_eager": speculation.is_eager,
        "seed": settings.seed,
        "max_model_len": settings.max_model_len or (TINY_MAX_MODEL_LEN if is_tiny else None),
        "kv_cache_memory_bytes": settings.kv_cache_memory_bytes or (TINY_KV_CACHE_BYTES if is_tiny else None),
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "stream_interval": settings.stream_interval,
        "disable_log_stats": False,
        "use_tqdm_on_load": settings.load_progress,
        "structured_outputs_config": {
            "backend": settings.structured_outputs_backend,
            "disable_any_whitespace": settings.structured_outputs_disable_any_whitespace,
            **({"reasoning_parser": settings.reasoning_parser} if settings.reasoning_parser else {}),
        },
        "enable_lora": settings.enable_lora or None,
        "max_loras": lora_slots(settings, is_cpu=is_cpu),
        "max_lora_rank": settings.max_lora_rank,
        "allowed_media_domains": settings.allowed_media_domains,
        "compilation_config": speculation.compilation_config,
        # The worker's plugin captures more graphs under the FULL it chose; vLLM's config says so.
        "additional_config": FULL_GRAPHS_CONFIG if speculation.is_worker_full_graphs else None,
        "speculative_config": None if spec is None else copy.deepcopy(spec),
        "per_request_spec_decode_metrics": None if spec is None else settings.per_request_spec_decode_metrics,
    }
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    # ENGINE_ARGS, the escape hatch, has the last word (its keys are checked against vLLM's at boot);
    # its compilation_config key by key, so that a capture size given there keeps the plan's mode.
    users = dict(settings.engine_args or {})
    if isinstance(users.get("compilation_config"), dict) and speculation.compilation_config is not None:
        users["compilation_config"] = {**speculation.compilation_config, **users["compilation_config"]}
    return {**kwargs, **users}


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


def engine_environment(
    settings: Settings, speculation: SpeculationPlan, *, mode: DeploymentMode
) -> dict[str, str | None]:
    """Process environment vLLM must see before the engine starts (``None``: unset it); the
    engine-core process inherits it. Applied by ``worker.runtime.boot_engine``.

    The 4-bit GEMM kernel on Hopper (``AWQ_KERNEL``): Machete, vLLM's default there, was slower
    than Marlin at batch 1 and faster at batch 256 (docs/benchmarks.md, "Quantization"). Serverless traffic is
    latency-bound (small batches): Marlin; pods run large batches: Machete.
    """
    kernel = settings.awq_kernel
    if kernel == "auto":
        kernel = "marlin" if mode == "serverless" else "machete"
    disabled = [k for k in (settings.vllm_disabled_kernels or "").split(",") if k and k != "MacheteLinearKernel"]
    if kernel == "marlin":
        disabled.append("MacheteLinearKernel")
    return {
        "VLLM_DISABLED_KERNELS": ",".join(disabled) or None,
        # V2 on a GPU, the CPU runner on the CPU build, told as the installed vLLM reads it.
        **runner_environment(is_cpu=speculation.model_runner == "cpu"),
        # FULL chosen by default: the worker's vLLM plugin keeps vLLM's fallback for backends without full graphs.
        FULL_GRAPHS_ENV: "1" if speculation.is_worker_full_graphs else None,
        # A draft model skips its pass at k = 0 (worker.vllm_internals.draft_skip), in the engine core.
        DRAFT_SKIP_ENV: "1" if speculation.skips_draft_pass else None,
        "VLLM_WORKER_MULTIPROC_METHOD": start_method(settings, mode=mode),
        "TRITON_CACHE_DIR": _triton_cache_dir(settings),
        # vLLM's startup plan (off in vLLM, on here): a boot keeps the memory profile's result under
        # VLLM_CACHE_ROOT, keyed by the configuration, GPU and library versions, and a later boot
        # that matches (and finds as much free memory) reserves that KV cache without measuring: a
        # shorter boot, a slightly smaller KV cache (docs/gpu-results/HISTORY.md, "The settings, as
        # measured"). vLLM falls back to profiling on any mismatch. Written as "1"/"0": vLLM parses
        # its variable as an int.
        "VLLM_ENABLE_STARTUP_PLAN": "1" if settings.vllm_enable_startup_plan else "0",
        # Media URLs (worker/media.py): public addresses only, no redirects; or vLLM's own connector.
        "VLLM_MEDIA_CONNECTOR": None if settings.allow_private_media_urls else PUBLIC_MEDIA_CONNECTOR,
    }


def start_method(settings: Settings, *, mode: DeploymentMode) -> Literal["fork", "spawn"]:
    """How vLLM starts its engine core (and, on a CPU, its model worker): ``fork`` or ``spawn``.

    vLLM's own server starts its engine core with spawn (its CLI sets this); the library default on
    a GPU is fork. A pod with a forked engine core answered a stream's first token later than vLLM's
    server in every paired run, spawned it did not (docs/gpu-results/HISTORY.md, "The settings, as
    measured"): pods spawn. Serverless forks: no re-import, a shorter boot. vLLM still spawns where
    fork is unsafe (CUDA already initialised in the process). vLLM's CPU platform sets spawn
    whatever was asked while it builds its config; the boot plan's environment is applied again
    after it (``worker.boot.launch.build_config``): a spawned process imports vLLM again, twice per
    engine on a CPU (engine core, model worker), which tripled the tiny model's boot on 2 cores.
    """
    return settings.vllm_worker_multiproc_method or ("spawn" if mode == "pod" else "fork")


def _triton_cache_dir(settings: Settings) -> str | None:
    """Triton's kernel cache, kept with vLLM's compile cache (on RunPod: the network volume).

    vLLM points Triton at a folder of its compile cache only while it compiles; a boot that loads
    the compiled graphs from that cache leaves Triton at its default, ``~/.triton/cache``, which a
    fresh container does not have, and re-runs V1's kernel JIT warm-up: a fresh container's boot
    took over half as long again without this folder (docs/gpu-results/HISTORY.md, "The settings,
    as measured"). Naming the folder makes both kinds of boot share one cache.
    """
    if settings.triton_cache_dir is not None:
        return settings.triton_cache_dir
    if settings.vllm_cache_root is None:
        return None  # Triton's own default, which persists wherever vLLM's default cache does
    return os.path.join(os.path.expanduser(settings.vllm_cache_root), "triton_cache")
