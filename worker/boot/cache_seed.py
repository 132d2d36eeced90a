"""vLLM's cache root, started from a seed where it is empty: a cache root an image carries, made by a
test job on a GPU of the endpoint's card kind.

Why: without a network volume every RunPod worker starts on an empty cache root, and a first boot
there does work a warm root keeps (docs/benchmarks.md, "Cold start": its phases): Triton
compiles vLLM's kernels the first time they run (the profile run and the warm-up before the graph
capture), vLLM inspects the model's class (``modelinfos``), measures the memory profile its startup
plan would have given (``startup_plan``), and a compiled engine compiles (``torch_compile_cache``).
An image is built without a GPU, so it cannot fill these itself: it carries a root filled elsewhere
(the Dockerfile's ``cache-seed`` build context), and each worker copies in what its own root lacks.

Why by hand: neither vLLM nor Triton has a read-only cache to fall back on; each reads one folder.
Only these four folders are seeded, because each keys what it keeps by what it depends on and
redoes the work on a mismatch: Triton's kernels by source, options, its version and the card's
compute capability; vLLM's model-class answers by the model module's hash; its startup plan by the
configuration, library versions, the card and its free memory; its compiled graphs by the
configuration, code and the card's name. A seed from another card kind is not used, and the boot
does what it would have done without it. (vLLM keeps other files in its root, such as its answer
on GPU peer access, keyed by device indices alone: those are not seeded.) One cost remains: a seed
from another vLLM release holds model-class answers that look present but are stale, so vLLM
inspects after its import instead of beside it (what that costs: docs/benchmarks.md): make the
seed again when the image's vLLM changes.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

__all__ = ["FIRST", "FOLDERS", "REST", "TRITON_FOLDER", "seed_cache_root"]

log = logging.getLogger(__name__)

# The seed's folder for Triton's kernels: where the worker puts Triton's cache in a vLLM cache root
# (worker/boot/engine_args.py), so a test job's root holds it under this name.
TRITON_FOLDER = "triton_cache"
# The folders seeded, in this order. FIRST are seeded before the boot starts the model-class
# inspection (worker/boot/modelinfo.py), which a seeded answer makes unneeded; REST after it, so
# that a long copy does not delay the inspection.
FIRST = ("modelinfos",)
REST = ("startup_plan", TRITON_FOLDER, "torch_compile_cache")
FOLDERS = (*FIRST, *REST)


def seed_cache_root(
    *, seed: str | None, cache_root: Path, triton_cache_dir: str | None, folders: tuple[str, ...] = FOLDERS
) -> dict[str, int]:
    """Copy each of ``folders`` from ``seed`` (a vLLM cache root, ``VLLM_CACHE_ROOT``'s layout) into
    ``cache_root`` where this root's folder of that name is missing or empty; the entries added, by
    folder (empty: nothing done). ``triton_cache`` goes to ``triton_cache_dir``, Triton's folder as
    the plan names it (None: Triton's own default, which the worker does not name, so not seeded).
    Never fails the boot: a seed that is not there, or a copy that fails (logged), leaves the root as
    the boot found it.

    A folder's entries (a kernel, a compiled graph, a model class's answer) are copied beside the
    folder first and moved into place whole, so that nothing reads half an entry; where two workers
    seed one network volume at once, each entry is kept from whichever came first."""
    if not seed:
        return {}
    seed = os.path.expanduser(seed)
    if not os.path.isdir(seed):
        return {}
    started = time.perf_counter()
    added: dict[str, int] = {}
    for name in folders:
        source = os.path.join(seed, name)
        if not os.path.isdir(source):
            continue
        target = triton_cache_dir if name == TRITON_FOLDER else str(cache_root / name)
        if target is None:
            log.info("Triton's cache not seeded from %s: its folder is Triton's default (set VLLM_CACHE_ROOT)", seed)
            continue
        count = _seed_folder(source, target)
        if count:
            added[name] = count
    if added:
        what = ", ".join(f"{name} {count}" for name, count in added.items())
        log.info("vLLM's cache root seeded from %s (entries: %s) in %.2f s", seed, what, time.perf_counter() - started)
    return added


def _seed_folder(seed: str, folder: str) -> int:
    """``seed``'s entries into ``folder`` if that has nothing yet; the number added."""
    staging: str | None = None
    added = 0
    try:
        if _is_empty(seed) or (os.path.isdir(folder) and not _is_empty(folder)):
            return 0  # an empty seed (an image built without one), or a folder with this root's own work
        os.makedirs(folder, exist_ok=True)
        # Beside the folder where it really is (it may be a link to another file system): moving an
        # entry into place is then a rename, whole or not at all.
        real = os.path.realpath(folder)
        staging = tempfile.mkdtemp(dir=os.path.dirname(real), prefix=os.path.basename(real) + ".seeding-")
        shutil.copytree(seed, staging, symlinks=True, dirs_exist_ok=True)
        for name in sorted(os.listdir(staging)):
            added += _move(os.path.join(staging, name), os.path.join(real, name))
    except OSError as exc:
        log.warning("%s not seeded from %s: %s", folder, seed, exc)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return added


def _move(entry: str, target: str) -> int:
    """``entry`` moved to ``target`` unless something is there already (another worker's copy, kept):
    1 if moved. A file is linked, which fails where the target exists (a rename would replace it);
    a folder is renamed, which fails where the target holds anything. Any other failure is raised."""
    try:
        if os.path.isdir(entry) and not os.path.islink(entry):
            os.rename(entry, target)
        else:
            os.link(entry, target, follow_symlinks=False)
        return 1
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return 0
        raise


def _is_empty(directory: str) -> bool:
    """Whether ``directory`` holds nothing: stops at its first entry (a warm volume's folders hold
    many, and every boot asks)."""
    with os.scandir(directory) as entries:
        return next(entries, None) is None
