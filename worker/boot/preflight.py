"""What a process refuses at its start, before it takes a job or opens its port: settings that can
never serve, found without a GPU or a download, and without vLLM but for ``ENGINE_ARGS``.

- a local path (``MODEL_NAME``, ``TOKENIZER_NAME``, the draft's, each ``LORA_MODULES`` adapter) that
  does not exist or holds no model (``config.json``; an adapter's ``adapter_config.json``);
- ``QUANTIZATION`` naming a checkpoint format (``awq``, ``gptq``, ...) for a local checkpoint that
  is not one: its ``config.json`` has no ``quantization_config`` and no file of that format's is
  beside it (vLLM would fail later with "Cannot find the config file for awq"). A hub model's
  files are not here before its first boot: a boot that fails is checked again once vLLM has
  fetched them (:func:`explain_boot_failure`), and the job's error names ``QUANTIZATION``;
- the default model (``MODEL_NAME`` unset, or a draft naming it) without its PyPI package, whose
  GGUF file the boot converts (an image installs no ``requirements-model.lock``: set ``MODEL_NAME``);
- an ``ENGINE_ARGS`` key that is not one of vLLM's engine arguments: the one check that imports
  vLLM (the boot's module, seconds on a CPU, which the boot then finds imported), and only where
  ``ENGINE_ARGS`` is set;
- a hub id that nothing here can fetch: not in RunPod's model cache nor the hub's own cache, and the
  hub is off (``HF_HUB_OFFLINE``) or cannot be reached (its client retries each file with
  back-off, and vLLM asks for several, before the boot fails).

Why at the start: a configuration error raised by a job asks RunPod for another worker, which takes
a job, fails it the same way and asks again. ``handler.py`` logs the sentence and exits before
``runpod.serverless.start``, so RunPod shows the worker failing to start and hands it no job; the
pod exits before it listens. Each check raises :class:`ConfigError` naming the variable.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from worker.boot.models import cached_snapshot, looks_local
from worker.config import Settings, is_embedded
from worker.errors import ConfigError
from worker.smollm2 import DEFAULT_MODEL, SmolLM2Missing, gguf_path

__all__ = ["CHECKPOINT_CONFIG_FILES", "check_at_start", "explain_boot_failure", "hub_reachable"]

# The QUANTIZATION values that read their configuration from the checkpoint, and the files vLLM 0.32
# looks for when config.json has no quantization_config (each class's get_config_filenames();
# tests/test_preflight.py checks them against the installed vLLM). Other values quantize online
# (fp8) or read config.json only (compressed-tensors).
CHECKPOINT_CONFIG_FILES: dict[str, tuple[str, ...]] = {
    "awq": ("quantize_config.json", "quant_config.json"),
    "auto_awq": ("quantize_config.json", "quant_config.json"),
    "awq_marlin": ("quantize_config.json", "quant_config.json"),
    "gptq": ("quantize_config.json",),
    "auto_gptq": ("quantize_config.json",),
    "gptq_marlin": ("quantize_config.json",),
    "moe_wna16": ("quantize_config.json",),
    "modelopt": ("hf_quant_config.json",),
    "modelopt_fp4": ("hf_quant_config.json",),
    "modelopt_mixed": ("hf_quant_config.json",),
    "modelopt_mxfp8": ("hf_quant_config.json",),
    "inc": ("quantization_config.json",),
}
_PROBE_TIMEOUT_S = 5.0


def check_at_start(
    settings: Settings,
    *,
    is_hub_offline: bool | None = None,
    hub_cache: Path | None = None,
    is_hub_reachable: Callable[[], str | None] | None = None,
) -> None:
    """Raise :class:`ConfigError` for the first setting that can never serve (the module's list).
    The hub's state defaults to its client's (``huggingface_hub.constants``: ``HF_HUB_OFFLINE``,
    its cache); ``is_hub_reachable`` answers None when the hub can be reached, else why not, and
    is asked once, only when a hub id is neither local nor cached."""
    refs = list(_references(settings))
    for variable, ref, kind in refs:
        if looks_local(ref):
            _check_local(variable, ref, kind=kind)
        elif ref == DEFAULT_MODEL:
            try:
                gguf_path()
            except SmolLM2Missing as exc:
                named = " unset" if variable == "MODEL_NAME" and settings.model_name is None else f"={ref}"
                raise ConfigError(f"{variable}{named}: {exc}", param=variable) from None
    if settings.engine_args:
        # The boot's own check, imported only here: the module imports vLLM's engine, which the boot finds imported.
        from worker.boot.launch import engine_args_problem

        if problem := engine_args_problem(settings.engine_args):
            raise ConfigError(problem, param="ENGINE_ARGS")
    if is_hub_offline is None or hub_cache is None:
        from huggingface_hub import constants

        is_hub_offline = constants.HF_HUB_OFFLINE if is_hub_offline is None else is_hub_offline
        hub_cache = Path(constants.HF_HUB_CACHE) if hub_cache is None else hub_cache
    # Not from the hub's own cache here: a snapshot there may hold config.json alone (fetched for a
    # tokenizer, say) without the quantization file beside it that the repository has.
    _check_quantization(settings, hub_cache=None)
    reason: str | None = None
    asked = False
    for variable, ref, _ in refs:
        if looks_local(ref) or is_embedded(ref) or Path(ref).is_dir() or _is_cached(ref, settings, hub_cache):
            continue
        if is_hub_offline:
            raise ConfigError(
                f"{variable}={ref}: not in the hub's cache ({hub_cache}) nor RunPod's, and HF_HUB_OFFLINE is set",
                param=variable,
            )
        if not asked:
            reason, asked = (is_hub_reachable or hub_reachable)(), True
        if reason is not None:
            raise ConfigError(
                f"{variable}={ref}: a hub id, but the hub cannot be reached from here ({reason}) and no copy "
                "is cached; give a local path, or serve where the hub is reachable",
                param=variable,
            )


def hub_reachable(endpoint: str | None = None, *, timeout_s: float = _PROBE_TIMEOUT_S) -> str | None:
    """None if a connection to the hub's endpoint (``HF_ENDPOINT``, as its client reads it) opens
    within ``timeout_s``, else why not, in a few words. Behind a proxy (``HTTPS_PROXY`` and the
    like) a direct connection tells nothing: None, and the hub's client finds out."""
    if urllib.request.getproxies().keys() & {"https", "http", "all"}:
        return None
    if endpoint is None:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    parts = urlsplit(endpoint)
    host = parts.hostname or endpoint
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or type(exc).__name__}"


def _references(settings: Settings) -> Iterator[tuple[str, str, str]]:
    """(variable, reference, kind) for each model reference the settings name."""
    yield "MODEL_NAME", settings.target_ref, "model"
    if settings.tokenizer_name:
        yield "TOKENIZER_NAME", settings.tokenizer_name, "tokenizer"
    spec = settings.resolved_speculative_config or {}
    if isinstance(spec.get("model"), str):
        variable = "SPECULATIVE_MODEL" if settings.speculative_model else "SPECULATIVE_CONFIG"
        yield variable, spec["model"], "model"
    for module in settings.lora_modules:
        yield f"LORA_MODULES ('{module.name}')", module.path, "adapter"


def _check_local(variable: str, ref: str, *, kind: str) -> None:
    path = Path(ref).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{variable}: {ref} is not a directory on this machine", param=variable.split()[0])
    wanted = {"model": ("config.json",), "tokenizer": (), "adapter": ("adapter_config.json",)}[kind]
    missing = [name for name in wanted if not (path / name).is_file()]
    if missing:
        what = "an adapter" if kind == "adapter" else "a model"
        raise ConfigError(f"{variable}: {ref} is not {what} (no {missing[0]} there)", param=variable.split()[0])


def explain_boot_failure(settings: Settings, *, hub_cache: Path | None = None) -> ConfigError | None:
    """After a boot failed, the quantization check again, now that the boot has fetched the hub
    model's JSON files into the hub's cache (vLLM fetches them all to find the quantization's): a
    ``QUANTIZATION`` the checkpoint is not in, named, in place of vLLM's "Cannot find the config
    file for awq" (read from the files, never from the message). None: they do not explain it."""
    if hub_cache is None:
        from huggingface_hub import constants

        hub_cache = Path(constants.HF_HUB_CACHE)
    try:
        _check_quantization(settings, hub_cache=hub_cache)
    except ConfigError as exc:
        return exc
    return None


def _check_quantization(settings: Settings, *, hub_cache: Path | None) -> None:
    method = settings.quantization
    files = CHECKPOINT_CONFIG_FILES.get(method or "")
    if method is None or files is None:
        return
    ref = settings.target_ref
    if is_embedded(ref):
        config: dict[str, object] = {}  # the embedded models are never quantized
        beside: list[str] = []
    else:
        path = _local_dir(ref, settings, hub_cache=hub_cache)
        if path is None:  # a hub id not fetched yet: its files are not here to read
            return
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):  # no readable config.json: vLLM says what is wrong with it
            return
        if not isinstance(config, dict):
            return
        beside = [p.name for p in path.glob("*.json")]
    if "quantization_config" in config or any(name.endswith(files) for name in beside):
        return
    raise ConfigError(
        f"QUANTIZATION={method}: MODEL_NAME={ref} is not quantized with {method} (its config.json has no "
        f"quantization_config, and no {' or '.join(files)} is beside it); unset QUANTIZATION to serve it "
        "as it is, or serve a checkpoint quantized that way",
        param="QUANTIZATION",
    )


def _local_dir(ref: str, settings: Settings, *, hub_cache: Path | None) -> Path | None:
    """Where the checkpoint's files are on this machine: a local path, else a snapshot in RunPod's
    model cache or (given) the hub's own, of the same layout, else None."""
    if looks_local(ref) or Path(ref).is_dir():
        return Path(ref).expanduser()
    for cache_dir in (settings.runpod_model_cache_dir, hub_cache):
        found = (
            None if cache_dir is None else cached_snapshot(ref, revision=settings.model_revision, cache_dir=cache_dir)
        )
        if found is not None:
            return found
    return None


def _is_cached(ref: str, settings: Settings, hub_cache: Path) -> bool:
    """In RunPod's model cache (served from it, offline), or any snapshot in the hub's own cache
    (its client falls back to it when the hub cannot be reached)."""
    if cached_snapshot(ref, revision=None, cache_dir=settings.runpod_model_cache_dir) is not None:
        return True
    snapshots = hub_cache / ("models--" + ref.replace("/", "--")) / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())
