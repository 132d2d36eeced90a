"""Where model references point: the embedded tiny models (``tiny:<variant>``), RunPod's model
cache (a hub id it holds is served from its snapshot, offline), local directories, or the hub."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.config import TINY_PREFIX, Settings
from worker.errors import EngineBootError

__all__ = ["cached_snapshot", "check_local_paths", "resolver"]

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


def resolver(settings: Settings) -> Callable[[str], str]:
    """Model references to what vLLM loads: ``tiny:`` names to the built tiny models, and a hub
    id that RunPod's model cache holds to its local snapshot (no download, no hub access)."""

    def resolve(ref: str) -> str:
        if ref.startswith(TINY_PREFIX):
            from worker.tiny_models import ensure_tiny_model

            return str(ensure_tiny_model(settings.worker_cache_dir, ref.removeprefix(TINY_PREFIX)))
        if ref == settings.model_name:
            revision = settings.model_revision
        else:
            revision = settings.draft_revision if ref == settings.draft_ref else None
        cached = cached_snapshot(ref, revision=revision, cache_dir=settings.runpod_model_cache_dir)
        if cached is not None:
            log.info("%s: serving RunPod's cached copy at %s", ref, cached)
            return str(cached)
        return ref

    return resolve


def check_local_paths(kwargs: dict[str, Any]) -> None:
    """A reference that is a filesystem path must exist and hold a config.json (else vLLM would try the hub)."""
    spec = kwargs.get("speculative_config") or {}
    for label, ref in (
        ("MODEL_NAME", kwargs.get("model")),
        ("TOKENIZER_NAME", kwargs.get("tokenizer")),
        ("SPECULATIVE_MODEL", spec.get("model")),
    ):
        if not isinstance(ref, str) or not ref.startswith(("/", "./", "../", "~")):
            continue
        path = Path(ref).expanduser()
        if not (path / "config.json").is_file() and not (label == "TOKENIZER_NAME" and path.is_dir()):
            raise EngineBootError(f"{label}: {ref} is not a model directory (no config.json there)")
