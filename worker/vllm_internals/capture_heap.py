"""vLLM's CUDA-graph capture without unfreezing the heap the worker froze.

vLLM wraps every bulk capture in ``vllm.utils.gc_utils.freeze_gc_for_cudagraph_capture``: one full
collection, then the heap frozen and the collector off while graphs are captured (a collection
during stream capture can finalise a Triton kernel and invalidate the graph), then ``gc.unfreeze()``
and another full collection. The unfreeze also undoes the freeze the worker made before vLLM forked
its engine core (``worker.boot.heap``), so the collection after the capture, and every full one after
it until the engine is ready (the KV cache's sizing calls ``gc.collect()``), walks the core's whole
heap again, on the first job's path (traced on H100s on vLLM 0.34; the figures:
docs/benchmarks.md).

:func:`keep_heap_frozen_through_capture` puts a context manager of the same contract in its place:
the same collection before the capture and the same collector off during it, and the same
collection after it, with nothing frozen or unfrozen. What was frozen before the capture stays
frozen: the worker freezes before vLLM starts its engine core, so before CUDA is initialised in
that process, and nothing frozen holds GPU memory (a reference cycle among it that dies later is
never freed; the engine core's shutdown unfreezes it). What was not frozen stays collectable,
which is why this context freezes nothing itself: vLLM collects after a capture because objects
frozen through it kept GPU memory that the KV cache then lacked (vLLM's PR 24128: a throughput
regression), and its CUDA-graph memory profiling builds a throwaway KV cache and graph pool before
a capture and frees them with a collection after it. With the collector off, vLLM's freeze during
the capture guards only against a ``gc.collect()`` inside it, which vLLM's capture code skips
while the collector is off (``breakable_cudagraph``) and PyTorch's ``torch.cuda.graph`` no longer
calls by default. ``VLLM_ENABLE_CUDAGRAPH_GC=1`` (vLLM's opt-out of its freeze) gets vLLM's own
function.

A replacement by name, since vLLM has no hook for it: the V2 runner binds the function at its import
(``from vllm.utils.gc_utils import ...``), which comes after the worker's plugin has run in that
process (vLLM loads its plugins before it builds a model runner; a forked engine core inherits the
parent's replacement), so the name is replaced in ``gc_utils``, and in the runner's module where a
process imported it earlier. 0.32's V1 runner binds it to its class when its module is imported,
which the same order covers. Every vLLM name used here is in the seam's contract
(``worker.vllm_internals.contract``).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

__all__ = ["keep_heap_frozen_through_capture"]

if TYPE_CHECKING:
    # What contextlib.contextmanager makes of a generator function: vLLM's context and this one.
    CaptureContext = Callable[[], contextlib._GeneratorContextManager[None, None, None]]

_RUNNER = "vllm.v1.worker.gpu.model_runner"
_REPLACED = "runpod_worker_keeps_the_heap_frozen"


def keep_heap_frozen_through_capture() -> None:
    """Put the worker's capture context in the place of vLLM's (module docstring). Once a process;
    a forked process inherits it."""
    import vllm.utils.gc_utils as gc_utils

    vllms = gc_utils.freeze_gc_for_cudagraph_capture
    if vars(vllms).get(_REPLACED):
        return
    replacement = _capture_without_unfreezing(vllms)
    gc_utils.freeze_gc_for_cudagraph_capture = replacement
    runner = sys.modules.get(_RUNNER)
    if runner is not None:
        runner.freeze_gc_for_cudagraph_capture = replacement  # type: ignore[attr-defined]


def _capture_without_unfreezing(vllms: CaptureContext) -> CaptureContext:
    """The replacement for ``vllms``, vLLM's own context, which it keeps for vLLM's opt-out."""

    @contextlib.contextmanager
    def capture_without_unfreezing() -> Iterator[None]:
        import vllm.envs as envs

        if envs.VLLM_ENABLE_CUDAGRAPH_GC:
            with vllms():
                yield
            return
        was_enabled = gc.isenabled()
        gc.collect()  # as vLLM's: the garbage finalised before the capture (what is frozen is skipped)
        gc.disable()
        try:
            yield
        finally:
            try:
                gc.collect()  # as vLLM's: what the capture and its caller left, the frozen heap skipped
            finally:
                if was_enabled:
                    gc.enable()

    capture_without_unfreezing.__dict__[_REPLACED] = True
    return capture_without_unfreezing
