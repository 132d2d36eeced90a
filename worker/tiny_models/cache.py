"""Where the tiny models are: built once a machine under the cache folder (a file lock keeps
concurrent builders from racing), each variant a folder of the build."""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from worker.builtin_models import TINY_VARIANTS
from worker.tiny_models.text import BUILD_VERSION, build_text_models
from worker.tiny_models.vision import VISION_BUILD_VERSION, build_vision

__all__ = ["VARIANTS", "TinyModels", "build_once", "ensure_tiny_model", "ensure_tiny_models"]

log = logging.getLogger(__name__)

VARIANTS = TINY_VARIANTS


@dataclass(frozen=True, slots=True)
class TinyModels:
    """Paths of the built tiny models."""

    root: Path

    def path(self, variant: str) -> Path:
        if variant not in VARIANTS:
            raise ValueError(f"unknown tiny model variant {variant!r}; known: {', '.join(VARIANTS)}")
        return self.root / variant

    @property
    def target(self) -> Path:
        return self.path("target")


def build_once(directory: Path, build: Callable[[Path], None], *, is_built: Callable[[Path], bool], lock: Path) -> Path:
    """``directory``, made by ``build`` unless ``is_built`` finds it made: one builder at a time on
    this machine (``lock``, a file lock), each building into a temporary sibling that replaces
    ``directory`` once complete, so that a build cut short leaves nothing that looks built."""
    if is_built(directory):
        return directory
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not is_built(directory):
            tmp = directory.with_name(directory.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            shutil.rmtree(directory, ignore_errors=True)
            tmp.rename(directory)
    return directory


def _ensure_vision(models: TinyModels) -> Path:
    return build_once(
        models.path("vision"),
        lambda tmp: build_vision(models.target, tmp),
        is_built=lambda directory: _is_built(directory, VISION_BUILD_VERSION),
        lock=models.root.parent / f".tiny-vision-{VISION_BUILD_VERSION}.lock",
    )


def _is_built(directory: Path, version: str) -> bool:
    try:
        return bool(json.loads((directory / "BUILD.json").read_text()).get("version") == version)
    except (OSError, ValueError):
        return False


def ensure_tiny_model(cache_dir: Path, variant: str) -> Path:
    """The directory of one tiny model (``tiny:<variant>``), built first if it is not there yet."""
    models = ensure_tiny_models(cache_dir)
    return _ensure_vision(models) if variant == "vision" else models.path(variant)


def ensure_tiny_models(cache_dir: Path, *, num_steps: int = 400) -> TinyModels:
    """Build the tiny models under ``cache_dir`` unless a complete build is already there."""
    root = Path(cache_dir) / f"tiny-llama-{BUILD_VERSION}"

    def build(tmp: Path) -> None:
        # A first run is otherwise silent for half a minute (2 cores; faster with more).
        log.info("building the embedded tiny model (about 35 s, once) in %s", root)
        build_text_models(tmp, num_steps=num_steps)

    build_once(
        root,
        build,
        is_built=lambda built: (built / "BUILD.json").exists(),
        lock=root.parent / f".tiny-llama-{BUILD_VERSION}.lock",
    )
    return TinyModels(root)
