"""Moving what a boot allocated out of the garbage collector's sight, without walking it first.

Once a process has booted (the engine in the main process, vLLM's serving layer for the pod), its
heap is mostly what stays for the process's life: modules, the engine, the tokenizer, hundreds of
thousands of tracked objects. vLLM's own server freezes it (``vllm.utils.gc_utils.freeze_gc_heap``)
so that later collections do not walk it again and again; but that helper first runs a full
collection of every generation, which walks the whole heap once, on the boot's critical path: the
first job of a cold worker waits for it (what it cost: docs/benchmarks.md, "Cold start").

``freeze_heap`` collects only the young generations, where the boot's last garbage is (the warm-up
requests' cycles), and freezes the rest as it is. What an older generation holds of garbage is
frozen with it and never freed: the collector runs its own full collections all through the
imports, so that is what became garbage since the last of them, a few hundred objects.

The boot freezes three times. Once after vLLM's import, which runs without the collector
(``imports_uncollected``): the import grows the heap from nothing to some 600k objects, and the
collector walks all of it each time it grows by a quarter, some nine full collections that took
1.6-1.7 s of the main process's import on an H100 host (docs/benchmarks.md, "Cold start"); one
young-generation collection at the end frees what the import left (17k objects here) in one walk.
Once before vLLM starts its engine core, which a serverless worker forks: the child inherits the
frozen heap, and vLLM's own full collections during its boot (thirteen on that host) skip it;
Python's advice for a fork without exec, in the ``gc.freeze`` docs. And once when the engine is
ready, for what the boot allocated since.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["freeze_heap", "imports_uncollected"]


def freeze_heap() -> None:
    """Collect the young generations, then freeze every tracked object (``gc.freeze``)."""
    gc.collect(0)
    gc.collect(1)
    gc.freeze()


@contextlib.contextmanager
def imports_uncollected() -> Iterator[None]:
    """The collector off while the block imports, then the heap frozen (``freeze_heap``) and the
    collector as it was, whether the block raised or not."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        freeze_heap()
        if was_enabled:
            gc.enable()
