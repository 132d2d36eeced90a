"""Where model references point: the default model (``smollm2:135m-instruct``, converted from its
PyPI package), the embedded tiny models (``tiny:<variant>``), RunPod's model cache (a hub id it
holds is served from its snapshot, offline), local directories, or the hub.

``resolve_references`` is the one place a boot resolves them: every reference of the engine
arguments (the target, its tokenizer, a draft model) and of the LoRA adapters, each once.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.config import TINY_PREFIX, Settings, drafts_with_model
from worker.errors import ConfigError, EngineBootError
from worker.smollm2 import DEFAULT_MODEL, SmolLM2Missing, ensure_smollm2

__all__ = [
    "ModelRef",
    "References",
    "cached_snapshot",
    "check_local_paths",
    "looks_local",
    "resolve_references",
    "resolver",
]

log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True, slots=True)
class ModelRef:
    """A model as the user named it (``label``: for messages), what vLLM loads (``path``: a local
    directory or a hub id), and its revision."""

    label: str
    path: str
    revision: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class References:
    """A boot's model references, resolved: the engine arguments with theirs replaced, the target
    and a separate draft model (None without one), and each LoRA adapter's, by name."""

    engine_kwargs: dict[str, Any]
    target: ModelRef
    draft: ModelRef | None
    lora_paths: dict[str, str]


def resolve_references(settings: Settings, kwargs: dict[str, Any]) -> References:
    """Resolve every model reference of a boot, each (reference, revision) once: ``model``,
    ``tokenizer`` and ``speculative_config.model`` in the engine arguments ``kwargs`` (the
    settings' or ``ENGINE_ARGS``'), each at its own revision as vLLM reads them (``revision``;
    ``tokenizer_revision``, else ``revision``, as vLLM defaults it; the speculative config's
    ``revision``), and the adapters of ``LORA_MODULES``. The target and a separate draft model are
    what the engine arguments name."""
    known: dict[tuple[str, str | None], str] = {}
    resolve = resolver(settings)

    def once(ref: str, revision: str | None) -> str:
        if (ref, revision) not in known:
            known[ref, revision] = resolve(ref, revision)
        return known[ref, revision]

    resolved = dict(kwargs)
    revision = kwargs.get("revision")
    named = kwargs["model"]
    resolved["model"] = once(named, revision)
    if isinstance(kwargs.get("tokenizer"), str):
        resolved["tokenizer"] = once(kwargs["tokenizer"], kwargs.get("tokenizer_revision") or revision)
    spec = kwargs.get("speculative_config")
    draft = None
    if isinstance(spec, dict) and isinstance(spec.get("model"), str):
        path = once(spec["model"], spec.get("revision"))
        resolved["speculative_config"] = {**spec, "model": path}
        if drafts_with_model(spec):
            draft = ModelRef(spec["model"], path, spec.get("revision"))
    return References(
        engine_kwargs=resolved,
        target=ModelRef(named, resolved["model"], revision),
        draft=draft,
        lora_paths={module.name: once(module.path, None) for module in settings.lora_modules},
    )


def resolver(settings: Settings) -> Callable[[str, str | None], str]:
    """Model references (at a revision: a commit, branch or tag, else None) to what vLLM loads: a
    hub id that RunPod's model cache holds to its local snapshot (no download, no hub access),
    the default model's name and ``tiny:`` names to their checkpoints (converted or built here,
    offline, on first use); anything else as it is."""

    def resolve(ref: str, revision: str | None) -> str:
        if ref == DEFAULT_MODEL:
            try:
                return str(ensure_smollm2(settings.worker_cache_dir))
            except SmolLM2Missing as exc:
                named = "MODEL_NAME unset or empty" if settings.model_name is None else ref
                raise ConfigError(f"{named}: {exc}") from None
        if not ref.startswith(TINY_PREFIX):
            return _cached_or_named(ref, revision, cache_dir=settings.runpod_model_cache_dir)
        from worker.tiny_models import VARIANTS, ensure_tiny_model

        variant = ref.removeprefix(TINY_PREFIX)
        if variant not in VARIANTS:  # a LoRA path or a config's model: the settings check the rest
            raise ConfigError(f"{ref} is not an embedded tiny model; they are tiny:{', tiny:'.join(VARIANTS)}")
        return str(ensure_tiny_model(settings.worker_cache_dir, variant))

    return resolve


def _cached_or_named(ref: str, revision: str | None, *, cache_dir: Path) -> str:
    cached = cached_snapshot(ref, revision=revision, cache_dir=cache_dir)
    if cached is not None:
        log.info("%s: serving RunPod's cached copy at %s", ref, cached)
        return str(cached)
    return ref


def looks_local(ref: str) -> bool:
    """A reference written as a filesystem path (absolute, relative with ./ or ../, or from ~), which
    must exist here: anything else that is not a directory here, vLLM takes for a hub id."""
    return ref.startswith(("/", "./", "../", "~"))


def check_local_paths(kwargs: dict[str, Any]) -> None:
    """A reference that is a filesystem path must exist and hold a config.json (else vLLM would try the hub)."""
    spec = kwargs.get("speculative_config") or {}
    for label, ref in (
        ("MODEL_NAME", kwargs.get("model")),
        ("TOKENIZER_NAME", kwargs.get("tokenizer")),
        ("SPECULATIVE_MODEL", spec.get("model")),
    ):
        if not isinstance(ref, str) or not looks_local(ref):
            continue
        path = Path(ref).expanduser()
        if not (path / "config.json").is_file() and not (label == "TOKENIZER_NAME" and path.is_dir()):
            raise EngineBootError(f"{label}: {ref} is not a model directory (no config.json there)")
