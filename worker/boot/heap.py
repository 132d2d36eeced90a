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

The boot freezes twice: once before vLLM starts its engine core, which a serverless worker forks
(the child inherits the frozen heap, and vLLM's own full collections during its boot skip it:
Python's advice for a fork without exec, in the ``gc.freeze`` docs), and once when the engine is
ready, for what the boot allocated since.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_heap"]


def freeze_heap() -> None:
    """Collect the young generations, then freeze every tracked object (``gc.freeze``)."""
    gc.collect(0)
    gc.collect(1)
    gc.freeze()
