"""What a process refuses at its start, before it takes a job or opens its port: settings that can
never serve, found without a GPU, a download or loading weights, and without vLLM but for the keys
of ``SPECULATIVE_CONFIG`` and ``ENGINE_ARGS``.

- a local path (``MODEL_NAME``, ``TOKENIZER_NAME``, the draft's, each ``LORA_MODULES`` adapter) that
  does not exist or holds no model (``config.json``; an adapter's ``adapter_config.json``);
- ``QUANTIZATION`` naming a checkpoint format (``awq``, ``gptq``, ...) for a local checkpoint that
  is not one: its ``config.json`` has no ``quantization_config`` and no file of that format's is
  beside it (vLLM would fail later with "Cannot find the config file for awq"). A hub model's
  files are not here before its first boot: a boot that fails is checked again once vLLM has
  fetched them (:func:`explain_boot_failure`), and the job's error names ``QUANTIZATION``;
- the default model (``MODEL_NAME`` unset, or a draft naming it) without its PyPI package, whose
  GGUF file the boot converts (an image installs no ``requirements-model.lock``: set ``MODEL_NAME``);
- a ``SPECULATIVE_CONFIG`` key that is not a field of vLLM's speculative config, or an
  ``ENGINE_ARGS`` key that is not one of vLLM's engine arguments, each named with the closest key
  vLLM has: the checks that import vLLM (``worker.vllm_internals.config_fields``: seconds on a CPU,
  which the boot then finds imported), and only where those settings are set;
- a hub id that nothing here can fetch: not in RunPod's model cache nor the hub's own cache, and the
  hub is off (``HF_HUB_OFFLINE``) or cannot be reached (its client retries each file with
  back-off, and vLLM asks for several, before the boot fails);
- what a model's own files show vLLM would refuse, where they are here (a local path, an embedded
  model, RunPod's cache or the hub's): ``MAX_MODEL_LEN`` (or ``ENGINE_ARGS``' ``max_model_len``)
  above the model's context limit, derived as vLLM derives it
  (:mod:`worker.vllm_internals.model_len`), and a ``SPECULATIVE_CONFIG`` ``max_model_len`` above the
  draft's or the target's; a draft model whose vocabulary or special tokens are not the target's
  (the boot's own check, :func:`worker.boot.draft_check.check_draft_compatible`, run now). A hub
  model not fetched yet is judged once a boot that failed has fetched it
  (:func:`explain_boot_failure`), and the job's error names the setting.

A drafter setting that the chosen method ignores (a draft model beside n-gram) is refused with the
other cross-field rules, when the settings are read (``worker/config/speculation.py``).

Why at the start: a configuration error raised by a job asks RunPod for another worker, which takes
a job, fails it the same way and asks again. ``handler.py`` logs the sentence and exits before
``runpod.serverless.start``, so RunPod shows the worker failing to start and hands it no job; the
pod exits before it listens. Each check raises :class:`ConfigError` naming the variable.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import socket
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from worker.boot.models import cached_snapshot, looks_local, resolver
from worker.config import Settings, drafts_with_model, is_embedded
from worker.errors import ConfigError, IncompatibleDraft
from worker.smollm2 import DEFAULT_MODEL, SmolLM2Missing, gguf_path
from worker.vllm_internals.model_len import ContextLimit, model_context_limit

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
                named = " unset or empty" if variable == "MODEL_NAME" and settings.model_name is None else f"={ref}"
                raise ConfigError(f"{variable}{named}: {exc}", param=variable) from None
    _check_keys(settings)
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
    _check_model_files(settings, hub_cache=hub_cache)


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
    """After a boot failed, the checks of the model's files again, now that the boot has fetched the
    hub models' files into the hub's cache (vLLM fetches every JSON file to find the quantization's,
    the draft check the tokenizers): a ``QUANTIZATION`` the checkpoint is not in, in place of vLLM's
    "Cannot find the config file for awq"; a ``MAX_MODEL_LEN`` above the model's limit; a draft of
    another vocabulary; each named (read from the files, never from the message). None: they do
    not explain it."""
    if hub_cache is None:
        from huggingface_hub import constants

        hub_cache = Path(constants.HF_HUB_CACHE)
    try:
        _check_quantization(settings, hub_cache=hub_cache)
        _check_model_files(settings, hub_cache=hub_cache)
    except ConfigError as exc:
        return exc
    return None


def _check_keys(settings: Settings) -> None:
    """``SPECULATIVE_CONFIG``'s and ``ENGINE_ARGS``' keys against vLLM's own, asked of vLLM only where
    the setting is set (importing it takes seconds)."""
    if settings.speculative_config:
        from worker.vllm_internals.config_fields import speculative_config_keys

        _refuse_unknown(
            "SPECULATIVE_CONFIG",
            settings.speculative_config,
            speculative_config_keys(),
            what="a key of vLLM's speculative config",
        )
    if settings.engine_args:
        from worker.vllm_internals.config_fields import engine_arg_names

        _refuse_unknown("ENGINE_ARGS", settings.engine_args, engine_arg_names(), what="a vLLM engine argument")


def _refuse_unknown(variable: str, given: Mapping[str, Any], known: frozenset[str], *, what: str) -> None:
    unknown = sorted(set(given) - known)
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        named.append(f"{key} (did you mean {close[0]}?)" if close else key)
    raise ConfigError(f"{variable}: {', '.join(named)}: not {what}", param=variable)


def _check_model_files(settings: Settings, *, hub_cache: Path | None) -> None:
    """What the models' files show vLLM would refuse (the module's list), judged on the engine
    arguments as the boot plan builds them (``ENGINE_ARGS`` has the last word there), whose parts
    read here (the models, ``max_model_len``, the draft's) are the same in either deployment mode.
    A model whose files are not here is not judged."""
    from worker.boot.engine_args import build_engine_kwargs
    from worker.config.host import is_cpu_build
    from worker.speculation.decide import decide

    is_cpu = is_cpu_build()
    kwargs = build_engine_kwargs(settings, decide(settings, mode="serverless", is_cpu=is_cpu), is_cpu=is_cpu)
    spec = kwargs.get("speculative_config") or {}
    in_engine_args = "max_model_len" in (settings.engine_args or {})
    is_requested = in_engine_args or settings.max_model_len is not None
    if not (is_requested or drafts_with_model(spec)):
        return

    def here(ref: str, revision: str | None) -> _Model:
        if is_embedded(ref):  # built or converted here, offline, as the boot would
            return _Model(ref, Path(resolver(settings)(ref, revision)), kwargs)
        return _Model(ref, _local_dir(ref, settings, revision=revision, hub_cache=hub_cache), kwargs)

    target = here(kwargs["model"], kwargs.get("revision"))
    requested = kwargs.get("max_model_len")
    if is_requested and isinstance(requested, int) and not settings.vllm_allow_long_max_model_len:
        limit = target.limit
        if limit is not None and requested > limit.tokens:
            named, variable = (
                ("ENGINE_ARGS' max_model_len", "ENGINE_ARGS") if in_engine_args else ("MAX_MODEL_LEN",) * 2
            )
            raise ConfigError(
                f"{named}={requested}: above the context limit of {target.ref}, {limit.tokens} tokens "
                f"({limit.source} in its config), which vLLM refuses: set {limit.tokens} or less, or unset it "
                "for the model's own",
                param=variable,
            )
    if not drafts_with_model(spec):
        return
    draft = here(spec["model"], spec.get("revision"))
    draft_len = spec.get("max_model_len")
    if isinstance(draft_len, int):  # vLLM's draft length: at most the draft's limit and the target's length
        bounds = {
            f"the context limit of the draft {draft.ref}": draft.limit_tokens,
            "the target's max_model_len": requested if isinstance(requested, int) else target.limit_tokens,
        }
        for what, tokens in bounds.items():
            if tokens is not None and draft_len > tokens:
                raise ConfigError(
                    f"SPECULATIVE_CONFIG: max_model_len {draft_len} is above {what}, {tokens} tokens, which vLLM "
                    "refuses: set it lower, or remove it",
                    param="SPECULATIVE_CONFIG",
                )
    _check_draft_vocabulary(settings, target=target, draft=draft)


@dataclasses.dataclass(frozen=True)
class _Model:
    """A model the engine arguments name: as named, where its files are here (None: not here yet),
    and the engine arguments that read it."""

    ref: str
    path: Path | None
    kwargs: Mapping[str, Any]

    @functools.cached_property
    def limit(self) -> ContextLimit | None:
        """Its context limit as vLLM derives it, where the files here say."""
        return None if self.path is None else model_context_limit(self.path, engine_kwargs=self.kwargs)

    @property
    def limit_tokens(self) -> int | None:
        return None if self.limit is None else self.limit.tokens

    @property
    def has_tokenizer(self) -> bool:
        """Its tokenizer's files are here, whole (a snapshot in the hub's cache may hold config.json alone)."""
        path = self.path
        return (
            path is not None
            and (path / "tokenizer_config.json").is_file()
            and any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json"))
        )


def _check_draft_vocabulary(settings: Settings, *, target: _Model, draft: _Model) -> None:
    """The boot's draft check (its sentence, naming both models), run at start where both models'
    config and tokenizer are here."""
    from worker.boot.draft_check import check_draft_compatible

    if not (target.has_tokenizer and draft.has_tokenizer):
        return
    variable = "SPECULATIVE_MODEL" if settings.speculative_model else "SPECULATIVE_CONFIG"
    try:
        check_draft_compatible(
            target=str(target.path),
            draft=str(draft.path),
            target_label=target.ref,
            draft_label=draft.ref,
            trust_remote_code=settings.trust_remote_code,
        )
    except IncompatibleDraft as exc:
        raise ConfigError(f"{variable}: {exc.message}", param=variable) from None


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
        path = _local_dir(ref, settings, revision=settings.model_revision, hub_cache=hub_cache)
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


def _local_dir(ref: str, settings: Settings, *, revision: str | None, hub_cache: Path | None) -> Path | None:
    """Where the checkpoint's files are on this machine: a local path, else a snapshot (at
    ``revision``) in RunPod's model cache or (given) the hub's own, of the same layout, else None."""
    if looks_local(ref) or Path(ref).is_dir():
        return Path(ref).expanduser()
    for cache_dir in (settings.runpod_model_cache_dir, hub_cache):
        found = None if cache_dir is None else cached_snapshot(ref, revision=revision, cache_dir=cache_dir)
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
