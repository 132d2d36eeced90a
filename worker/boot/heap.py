"""Moving what a boot allocated out of the garbage collector's sight, so that its collections stop
walking it again and again.

Once a process has booted (the engine in the main process, vLLM's serving layer for the pod), its
heap is mostly what stays for the process's life: modules, the engine, the tokenizer, hundreds of
thousands of tracked objects. Every full collection walks all of them, and a boot runs many
(docs/gpu-results/HISTORY.md, "The levers, and what each did", has each one timed on a GPU host).
vLLM's own server freezes the heap once it has started (``vllm.utils.gc_utils.freeze_gc_heap``),
but only after a full collection of every generation, which the first job of a cold worker would
wait for.

``freeze_heap`` collects only the young generations, where the boot's last garbage is, in one walk
(``gc.collect(1)`` takes generation 0 with it), and freezes the rest as it is. Garbage in the
oldest generation is frozen with it and never freed; so is what a frozen object drops later into a
reference cycle. The boot's three freezes, each where a walk of the whole heap would otherwise
repeat:

- after vLLM's import (``imports_uncollected``), which runs with the collector off: the import grows
  the heap from nothing, and the collector would walk all of it each time it grew by a quarter. The
  collector is off for the whole process meanwhile (the weights' prefetch thread included); what
  the import leaves as garbage waits for the one collection at its end;
- right before vLLM starts its engine core, which a serverless worker forks (Python's advice for a
  fork without exec, in the ``gc.freeze`` docs): the core inherits the frozen heap, and the full
  collections vLLM runs while it boots skip it, after its CUDA-graph capture too (vLLM's capture
  context would unfreeze it; the seam's does not: ``worker.vllm_internals.capture_heap``);
- when the engine is ready, for what the boot allocated since.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["freeze_heap", "imports_uncollected"]


def freeze_heap() -> None:
    """Collect the young generations, then freeze every tracked object (``gc.freeze``)."""
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
