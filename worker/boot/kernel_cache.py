"""Triton's kernel cache, started from a seed when it is empty: a cache an image carries, filled by a
boot on a GPU of the endpoint's card kind.

Why: without a network volume every RunPod worker starts on an empty cache root, and on vLLM 0.34
most of what such a boot adds over a warm one is Triton compiling vLLM's kernels the first time they
run (the profile run and the warm-up before the graph capture); a fresh container given an earlier
boot's Triton cache booted as a warm one does there (docs/benchmarks.md, "The first worker without a
volume"). An image is built without a GPU, so it cannot fill the cache itself: it carries one made
elsewhere (the Dockerfile's ``triton-cache`` build context).

Why by hand: Triton reads one cache folder (``TRITON_CACHE_DIR``), and neither it nor vLLM has a
read-only fallback to look in. A seed is always safe to use: Triton keys each kernel by its source,
options, its own version and the card's compute capability, so a kernel of another card kind or
another vLLM is never found, and is compiled as it would have been without the seed.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

__all__ = ["seed_triton_cache"]

log = logging.getLogger(__name__)


def seed_triton_cache(*, seed: str | None, cache_dir: str | None) -> int:
    """Copy the cache ``seed`` into ``cache_dir`` if that has nothing in it yet; the number of
    kernel folders added (0: nothing done). ``cache_dir`` None: Triton's own default folder, which
    the worker does not name, so nothing is seeded. Never fails the boot: a seed that is not there,
    or a copy that fails (logged), leaves the cache as Triton would have found it.

    Each of Triton's entries (a folder per kernel hash) is copied beside ``cache_dir`` first and
    renamed into place whole, so that Triton never reads half an entry; where two workers seed one
    network volume at once, each entry is kept from whichever came first."""
    if not seed or not os.path.isdir(seed):
        return 0
    if cache_dir is None:
        log.info("Triton's cache not seeded from %s: its folder is Triton's default (set VLLM_CACHE_ROOT)", seed)
        return 0
    started = time.perf_counter()
    staging: str | None = None
    added = 0
    try:
        if _is_empty(seed) or (os.path.isdir(cache_dir) and not _is_empty(cache_dir)):
            return 0  # an empty seed (an image built without one), or a cache with this volume's own kernels
        parent = os.path.dirname(os.path.abspath(cache_dir))
        os.makedirs(cache_dir, exist_ok=True)
        staging = tempfile.mkdtemp(dir=parent, prefix=os.path.basename(cache_dir) + ".seeding-")
        shutil.copytree(seed, staging, symlinks=True, dirs_exist_ok=True)
        for name in sorted(os.listdir(staging)):
            try:
                os.rename(os.path.join(staging, name), os.path.join(cache_dir, name))
                added += 1
            except OSError:  # another worker's copy of the same entry landed first
                continue
    except OSError as exc:
        log.warning("Triton's cache not seeded from %s: %s", seed, exc)
        return added
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    log.info("Triton's cache seeded from %s: %d entries in %.2f s", seed, added, time.perf_counter() - started)
    return added


def _is_empty(directory: str) -> bool:
    """Whether ``directory`` holds nothing: stops at its first entry (a warm volume's cache holds many,
    and every boot asks)."""
    with os.scandir(directory) as entries:
        return next(entries, None) is None
