"""vLLM's CUDA-graph capture without its walk of the whole heap after it.

vLLM wraps every bulk capture in ``vllm.utils.gc_utils.freeze_gc_for_cudagraph_capture``: one full
collection, then the heap frozen and the collector off while graphs are captured (a collection
during stream capture can finalise a Triton kernel and invalidate the graph), then ``gc.unfreeze()``
and another full collection. The unfreeze also undoes the freeze the worker made before vLLM forked
its engine core (``worker.boot.heap``), so the collection after the capture, and every full one
after it until the engine is ready (the KV cache's sizing calls ``gc.collect()``), walks the whole
heap of the core: about 0.8 million objects, 0.44-0.56 s each, two of them on the first job's path
on an H100 host (docs/benchmarks.md, "Cold start": the boot's collections traced).

:func:`keep_heap_frozen_through_capture` puts a context manager of the same contract in its place:
the same collection before, the same freeze and the collector off during the capture, and after it
one collection of what is not frozen, with nothing unfrozen. The objects frozen at the capture's
start (the boot's: live, since the collection before it just ran) stay frozen, as vLLM's own
``freeze_gc_heap`` leaves them once the engine has started; a reference cycle among them that dies
later is never freed, which is the trade any freeze makes. Reference counting frees them as before.
``VLLM_ENABLE_CUDAGRAPH_GC=1`` (vLLM's opt-out of the freeze) gets vLLM's own function.

It is a replacement by name, which vLLM has no hook for: vLLM's V2 runner binds the function at its
import (``from vllm.utils.gc_utils import ...``), so the name is replaced in ``gc_utils`` before the
runner is imported (the plugin runs in the engine core before it builds its model runner), and in
the runner's module too where a process has imported it already. Every vLLM name used here is in the
seam's contract (``worker.vllm_internals.contract``).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["keep_heap_frozen_through_capture"]

_RUNNER = "vllm.v1.worker.gpu.model_runner"
_NAME = "freeze_gc_for_cudagraph_capture"
_REPLACED = "runpod_worker_keeps_the_heap_frozen"


def keep_heap_frozen_through_capture() -> None:
    """Put :func:`_capture_with_heap_frozen` in the place of vLLM's capture context (module
    docstring). Once a process; a forked process inherits it."""
    import vllm.utils.gc_utils as gc_utils

    vllms = gc_utils.freeze_gc_for_cudagraph_capture
    if vars(vllms).get(_REPLACED):
        return
    replacement = _capture_with_heap_frozen(vllms)
    gc_utils.freeze_gc_for_cudagraph_capture = replacement
    runner = sys.modules.get(_RUNNER)
    if runner is not None:
        runner.freeze_gc_for_cudagraph_capture = replacement  # type: ignore[attr-defined]


def _capture_with_heap_frozen(vllms: Callable[[], contextlib.AbstractContextManager[Any]]) -> Any:
    @contextlib.contextmanager
    def capture_with_heap_frozen() -> Iterator[None]:
        import vllm.envs as envs

        if envs.VLLM_ENABLE_CUDAGRAPH_GC:
            with vllms():
                yield
            return
        was_enabled = gc.isenabled()
        gc.collect()  # as vLLM's: the garbage finalised before the capture; walks only what is not frozen
        gc.freeze()
        gc.disable()
        try:
            yield
        finally:
            try:
                gc.collect()  # what the capture left; the frozen heap stays frozen
            finally:
                if was_enabled:
                    gc.enable()

    capture_with_heap_frozen.__dict__[_REPLACED] = True
    capture_with_heap_frozen.__wrapped__ = vllms  # type: ignore[attr-defined]
    return capture_with_heap_frozen
