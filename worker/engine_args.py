"""Settings to vLLM engine keyword arguments: a pure function, testable without vLLM.

Model references of the form ``tiny:<variant>`` (and an unset ``MODEL_NAME``) name the
embedded tiny models; ``resolve`` maps them to local paths.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.config import TINY_PREFIX, Settings

__all__ = ["TINY_KV_CACHE_BYTES", "TINY_MAX_MODEL_LEN", "build_engine_kwargs", "cached_snapshot", "model_ref"]

TINY_MAX_MODEL_LEN = 1024
TINY_KV_CACHE_BYTES = 256 * 2**20


def model_ref(settings: Settings) -> str:
    return settings.model_name or f"{TINY_PREFIX}target"


_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def cached_snapshot(ref: str, *, revision: str | None, cache_dir: Path) -> Path | None:
    """The local snapshot of hub model ``ref`` in a cache of the hub's layout (RunPod's cached
    models), or None: ``models--ORG--NAME/snapshots/<commit>``, the commit being ``revision``
    (a commit hash, or a branch or tag named under ``refs/``), else ``refs/main``, else the only
    snapshot there is. A snapshot without ``config.json`` does not count."""
    if not _HUB_ID.match(ref):
        return None
    repo = cache_dir / ("models--" + ref.replace("/", "--"))
    snapshots = repo / "snapshots"
    named = repo / "refs" / (revision or "main")
    commit = named.read_text().strip() if named.is_file() else revision
    if commit is None and snapshots.is_dir():
        found = [path.name for path in snapshots.iterdir() if path.is_dir()]
        commit = found[0] if len(found) == 1 else None
    if commit is None:
        return None
    path = snapshots / commit
    return path if (path / "config.json").is_file() else None


def build_engine_kwargs(settings: Settings, *, resolve: Callable[[str], str]) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` keyword arguments. Unset settings keep vLLM's defaults."""
    is_tiny = settings.is_tiny_default
    kwargs: dict[str, Any] = {
        "model": resolve(model_ref(settings)),
        "revision": settings.model_revision,
        "tokenizer": resolve(settings.tokenizer_name) if settings.tokenizer_name else None,
        "tokenizer_revision": settings.tokenizer_revision,
        "dtype": settings.dtype,
        "quantization": settings.quantization,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "load_format": settings.load_format,
        "trust_remote_code": settings.trust_remote_code,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "tensor_parallel_size": settings.tensor_parallel_size,
        # The tiny model boots in seconds in eager mode; compiling it would take longer than it runs.
        "enforce_eager": settings.enforce_eager or is_tiny,
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
        "max_loras": settings.max_loras,
        "max_lora_rank": settings.max_lora_rank,
    }
    spec = settings.resolved_speculative_config()
    if spec is not None:
        if isinstance(spec.get("model"), str):
            spec["model"] = resolve(spec["model"])
        kwargs["speculative_config"] = spec
        kwargs["per_request_spec_decode_metrics"] = settings.per_request_spec_decode_metrics
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    # ENGINE_ARGS, the escape hatch, has the last word (its keys are checked against vLLM's at boot).
    return {**kwargs, **(settings.engine_args or {})}
