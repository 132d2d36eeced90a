"""Triton's kernel cache, started from a seed when it is empty: a cache an image carries, filled by a
boot on a GPU of the endpoint's card kind.

Why: without a network volume every RunPod worker starts on an empty cache root, and on vLLM 0.34
about 20 s of such a boot is Triton compiling vLLM's kernels the first time they run (the profile
run and the warm-up before the graph capture). A fresh container given a copy of the Triton cache
of an earlier boot on the same card kind streamed its first token at 23.0 s instead of 35.4-36.8 s
(H100, docs/benchmarks.md, "The first worker without a volume"). An image is built without a GPU,
so it cannot fill the cache itself: it carries one made elsewhere (the Dockerfile's
``triton-cache/``).

Why by hand: Triton reads one cache folder (``TRITON_CACHE_DIR``), and neither it nor vLLM has a
read-only fallback to look in. A seed is always safe to use: Triton keys each kernel by its source,
options, its own version and the card's compute capability, so a kernel of another card kind or
another vLLM is never found, and is compiled as it would have been without the seed.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

__all__ = ["seed_triton_cache", "triton_cache_dir"]

log = logging.getLogger(__name__)


def triton_cache_dir(environ: dict[str, str] | os._Environ[str]) -> str:
    """The folder Triton caches its kernels in: ``TRITON_CACHE_DIR``, else Triton's default
    (``$TRITON_HOME/.triton/cache``, ``TRITON_HOME`` defaulting to the home folder)."""
    named = environ.get("TRITON_CACHE_DIR")
    if named:
        return named
    return os.path.join(environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")


def seed_triton_cache(seed: str | None, cache_dir: str) -> int:
    """Copy the cache ``seed`` into ``cache_dir`` if that has nothing in it yet; the number of files
    copied (0: nothing done). Never fails the boot: a seed that is not there, or a copy that fails
    (logged), leaves the cache as it was, and Triton compiles as it would have.

    The copy goes to a folder beside ``cache_dir`` and is renamed into place, so that Triton never
    reads half a seed, and of two workers seeding one network volume at once, one copy is kept."""
    if not seed or not os.path.isdir(seed):
        return 0
    if os.path.isdir(cache_dir) and os.listdir(cache_dir):
        return 0  # a cache of this volume's own: it already holds what this boot compiled before
    started = time.perf_counter()
    staging = f"{cache_dir.rstrip(os.sep)}.seeding-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(staging) or ".", exist_ok=True)
        shutil.copytree(seed, staging, symlinks=True)
        num_files = sum(len(files) for _, _, files in os.walk(staging))
        if os.path.isdir(cache_dir):
            os.rmdir(cache_dir)  # empty (checked above); fails if another worker filled it since
        os.rename(staging, cache_dir)
    except OSError as exc:
        log.warning("Triton's cache not seeded from %s: %s", seed, exc)
        shutil.rmtree(staging, ignore_errors=True)
        return 0
    log.info("Triton's cache seeded from %s: %d files in %.2f s", seed, num_files, time.perf_counter() - started)
    return num_files
