"""Read the model's weight files into the page cache while vLLM is still being imported; and what
else a boot starts before it imports vLLM (:func:`prepare_boot`).

A boot spends its first seconds importing vLLM with the disk idle (the main process; how long:
docs/benchmarks.md), then the engine core reads the weights with the CPU mostly idle; on a new
RunPod host the weights come from a cold disk or a network volume. ``start(plan)`` runs before
vLLM is imported: it finds the weight files of the target (and of a separate draft) where they
already are on local disk (a local directory, RunPod's model cache), and if they fit in the
memory the kernel reports available it reads them on background threads, so that the engine core
finds them resident.

Only reads: nothing is written or kept. Never blocks or fails the boot: a missing or unreadable
file is skipped (vLLM's loader reports what is really missing), and what does not fit in free
memory is not read at all (``PREFETCH_WEIGHTS=true`` reads it anyway; ``false``: never).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.boot.plan import BootPlan

__all__ = [
    "Prefetch",
    "available_memory_bytes",
    "evict",
    "prepare_boot",
    "resident_fraction",
    "resident_share",
    "start",
    "weight_files",
]

log = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_CHUNK = 16 * 2**20
_NUM_THREADS = 4
# What may be read: this share of the memory the kernel says is available (the rest stays for the
# processes the boot is about to start).
_FREE_MEMORY_SHARE = 0.8


def weight_files(directory: Path) -> list[Path]:
    """The weight files vLLM would load from ``directory``: its safetensors, else its PyTorch files."""
    if not directory.is_dir():
        return []
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    safetensors = [p for p in files if p.name.endswith(".safetensors")]
    return safetensors or files


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """``MemAvailable`` from the kernel, or None where there is no such file."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Prefetch:
    """The reading in progress: its files, and what has been read (for logs and tests)."""

    files: list[Path]
    num_bytes: int
    done: threading.Event = field(default_factory=threading.Event)
    num_read: int = 0
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None

    def wait(self, timeout_s: float | None = None) -> bool:
        return self.done.wait(timeout_s)


def start(plan: BootPlan) -> Prefetch | None:
    """Start reading the weights on background threads, if the settings ask for it and they fit."""
    setting = plan.settings.prefetch_weights
    if setting is False:
        return None
    files = [path for directory in plan.local_paths for path in weight_files(directory)]
    sizes = {}
    for path in files:
        try:
            sizes[path] = path.stat().st_size
        except OSError:
            continue
    if not sizes:
        return None
    total = sum(sizes.values())
    available = available_memory_bytes()
    if setting is None and (available is None or total > available * _FREE_MEMORY_SHARE):
        log.info(
            "prefetch: skipped, %.2f GB of weights against %s GB of available memory",
            total / 1e9,
            "unknown" if available is None else f"{available / 1e9:.2f}",
        )
        return None
    job = Prefetch(files=list(sizes), num_bytes=total)
    log.info("prefetch: reading %d weight file(s), %.2f GB, while vLLM loads", len(sizes), total / 1e9)
    # Daemon threads of its own rather than a ThreadPoolExecutor: the interpreter joins an
    # executor's threads at exit, so a boot that fails early would wait for gigabytes of reads.
    pending = list(sizes)
    lock = threading.Lock()
    remaining = [min(_NUM_THREADS, len(pending))]

    def worker() -> None:
        buffer = bytearray(_CHUNK)
        while True:
            with lock:
                if not pending:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        job.finished_at = time.monotonic()
                        job.done.set()
                        log.info(
                            "prefetch: %.2f GB read in %.1f s", job.num_read / 1e9, job.finished_at - job.started_at
                        )
                    return
                path = pending.pop(0)
            num_read = _read(path, buffer)
            with lock:
                job.num_read += num_read

    for i in range(remaining[0]):
        threading.Thread(target=worker, name=f"prefetch-{i}", daemon=True).start()
    return job


def prepare_boot(plan: BootPlan) -> None:
    """What a process that starts vLLM's engine does before importing vLLM: start reading the
    weights (they are read while the imports run), set the environment the engine must inherit, seed
    an empty cache root (``worker.boot.cache_seed``) and start the model-class inspection
    (``worker.boot.modelinfo``), all as the plan says."""
    from worker.boot import cache_seed, modelinfo

    start(plan)
    plan.apply_environment(os.environ)
    seed = functools.partial(
        cache_seed.seed_cache_root,
        seed=plan.settings.cache_seed,
        cache_root=plan.settings.vllm_cache_dir,
        triton_cache_dir=plan.environment["TRITON_CACHE_DIR"],
    )
    # The model-class answers before the inspection, which a seeded answer makes unneeded; the rest
    # after it starts, and before vLLM starts the engine core, whose first kernels Triton compiles
    # (or finds here).
    seed(folders=cache_seed.FIRST)
    modelinfo.start(plan)  # after the environment, which its subprocess inherits
    seed(folders=cache_seed.REST)


def _read(path: Path, buffer: bytearray) -> int:
    """Read ``path`` once, front to back (its pages then sit in the page cache); bytes read."""
    num_read = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        view = memoryview(buffer)
        while True:
            n = os.readv(fd, [view])
            if n <= 0:
                return num_read
            num_read += n
    except OSError:
        return num_read
    finally:
        os.close(fd)


def resident_share(path: Path) -> float:
    """The share of ``path``'s pages in the page cache (``mincore`` on a mapping of it), 0.0-1.0.
    For checks and benchmarks: whether a boot found its weights on a cold disk or in memory."""
    import ctypes
    import mmap

    size = path.stat().st_size
    if size == 0:
        return 1.0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            num_pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * num_pages)()
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(byte & 1 for byte in vector) / num_pages
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)


def resident_fraction(files: list[Path]) -> float:
    """The share of all of ``files``' bytes in the page cache, 0.0-1.0 (each file weighted by its size)."""
    sizes = [path.stat().st_size for path in files]
    resident = sum(resident_share(path) * size for path, size in zip(files, sizes, strict=True))
    return resident / max(1, sum(sizes))


def evict(path: Path) -> None:
    """Drop ``path``'s clean pages from the page cache (``POSIX_FADV_DONTNEED`` after a sync):
    the next read comes from the disk. For tests and benchmarks of a cold boot."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
