"""worker.boot.heap: the boot's heap frozen without a full collection on the first job's path."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import CACHE_DIR
from worker.boot.heap import freeze_heap, imports_uncollected
from worker.boot.plan import build_plan
from worker.config import load_settings


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _garbage_cycle() -> weakref.ref[_Node]:
    """A reference cycle, unreachable once this returns: only the collector frees it, and the weak
    reference says whether it did."""
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    return weakref.ref(first)


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations the collector collects while the test runs; the heap unfrozen before and after
    it (what an earlier test froze would otherwise count as this test's freeze)."""
    generations: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.unfreeze()
    gc.collect()  # what the tests before left: not this test's to see
    gc.callbacks.append(record)
    try:
        yield generations
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()


def test_the_heap_is_frozen_after_young_collections_only(collections: list[int]) -> None:
    num_tracked = len(gc.get_objects())
    freeze_heap()
    assert gc.get_freeze_count() >= num_tracked * 0.9
    assert collections == [1], collections  # one walk of the young generations, none of the whole heap


def test_the_boots_last_garbage_is_collected_before_freezing(collections: list[int]) -> None:
    gone = _garbage_cycle()
    freeze_heap()
    assert gone() is None


def test_the_heap_is_frozen_before_vllm_starts_its_engine_core(
    collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serverless worker forks its engine core: the child inherits the frozen heap, so vLLM's full
    collections during its boot skip what the parent allocated. A recorder stands for the start of
    vLLM's engine core (``core_first.start_core``, which forks it, named as the boot names it): what
    matters is the heap at the moment the core starts, which a real start does not report."""
    from worker.boot import launch as boot
    from worker.errors import EngineBootError
    from worker.vllm_internals import core_first

    frozen_at_start: list[int] = []

    def recording_start(*_: Any, **__: Any) -> None:
        frozen_at_start.append(gc.get_freeze_count())
        raise RuntimeError("the engine core's start, recorded")

    monkeypatch.setattr(core_first, "start_core", recording_start)
    settings = load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR)})
    plan = build_plan(settings, mode="serverless")
    num_tracked = len(gc.get_objects())
    assert gc.get_freeze_count() == 0
    with pytest.raises(EngineBootError, match="recorded"):
        boot.create_engine(plan)
    assert frozen_at_start and frozen_at_start[0] >= num_tracked * 0.9


def test_an_import_runs_without_the_collector_and_leaves_the_heap_frozen(collections: list[int]) -> None:
    gone = _garbage_cycle()
    with imports_uncollected():
        assert not gc.isenabled()
        grown = [_Node() for _ in range(100_000)]  # what would start collections with the collector on
    assert collections == [1], collections  # freeze_heap's one walk, none before it
    assert gc.isenabled() and gone() is None and gc.get_freeze_count() >= len(grown)


def test_a_collector_that_was_off_stays_off(collections: list[int]) -> None:
    gc.disable()
    try:
        with imports_uncollected():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failed_import_gives_the_collector_back(collections: list[int]) -> None:
    with pytest.raises(ImportError), imports_uncollected():
        import worker.no_such_module  # noqa: F401
    assert gc.isenabled()


@pytest.mark.slow  # imports vLLM in a process of its own
def test_the_boot_imports_vllm_without_a_full_collection() -> None:
    """In a process of its own, where vLLM is not imported yet: the boot's import of vLLM
    (``worker.runtime.import_boot``) runs no full collection and leaves the heap frozen. And the
    worker's plugin, as vLLM's engine core registers it before it imports its model runner, has the
    runner capture with the worker's context (``worker.vllm_internals.capture_heap``)."""
    script = (
        "import gc, json, sys\n"
        "import worker.runtime as runtime\n"
        "assert 'vllm' not in sys.modules\n"
        "full = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and info['generation'] == 2 and full.append(1))\n"
        "runtime.import_boot()\n"
        "result = {'full': len(full), 'frozen': gc.get_freeze_count(), 'vllm': 'vllm' in sys.modules}\n"
        "from worker.vllm_internals.plugin import register\n"
        "register()\n"
        "from vllm.utils import gc_utils\n"
        "import vllm.v1.worker.gpu.model_runner as runner\n"
        "result['runner_binds'] = runner.freeze_gc_for_cudagraph_capture is gc_utils.freeze_gc_for_cudagraph_capture\n"
        "result['replaced'] = gc_utils.freeze_gc_for_cudagraph_capture.__module__\n"
        "print(json.dumps(result))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["vllm"] and result["full"] == 0 and result["frozen"] > 100_000, result
    assert result["runner_binds"] and result["replaced"] == "worker.vllm_internals.capture_heap", result


def _vllms_capture_context() -> Any:
    """vLLM's capture context as its V2 model runner calls it, with the worker's replacement in place
    (``keep_heap_frozen_through_capture``, as the worker's plugin calls it in each process)."""
    from vllm.utils import gc_utils

    from worker.vllm_internals.capture_heap import keep_heap_frozen_through_capture

    keep_heap_frozen_through_capture()
    return gc_utils.freeze_gc_for_cudagraph_capture()


def test_the_heap_frozen_before_a_graph_capture_stays_frozen_after_it(collections: list[int]) -> None:
    """vLLM's own context unfreezes the whole heap after the capture and walks it; the worker's
    collects what the capture left and keeps the rest frozen."""
    capture = _vllms_capture_context()
    freeze_heap()
    frozen = gc.get_freeze_count()
    collections.clear()
    with capture:
        assert not gc.isenabled()  # no collection during a capture
        gone = _garbage_cycle()
    assert gc.isenabled() and gone() is None
    # vLLM's own context leaves nothing frozen. Not ">= frozen": other threads of this process (a
    # session's engines, in the same test worker) may free a few frozen objects meanwhile (a run
    # lost 12 of 795,268).
    assert gc.get_freeze_count() >= 0.99 * frozen, (gc.get_freeze_count(), frozen)
    assert collections.count(2) == 2, collections  # one before the capture, one after: vLLM's two


def test_what_lives_at_a_captures_start_stays_collectable(collections: list[int]) -> None:
    """vLLM's CUDA-graph memory profiling builds a throwaway KV cache and graph pool before a capture
    and frees them after it with a collection: the capture must not freeze them for good."""
    capture = _vllms_capture_context()
    freeze_heap()
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    profiled = weakref.ref(first)
    with capture:
        pass
    del first, second
    gc.collect()
    assert profiled() is None


def test_a_collector_that_was_off_stays_off_through_a_capture(collections: list[int]) -> None:
    capture = _vllms_capture_context()
    gc.disable()
    try:
        with capture:
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_capture_that_raises_gives_the_collector_back(collections: list[int]) -> None:
    with pytest.raises(RuntimeError, match="capture failed"), _vllms_capture_context():
        raise RuntimeError("capture failed")
    assert gc.isenabled()


def test_vllms_opt_out_of_the_capture_freeze_gets_vllms_own_context(
    collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm.envs as envs

    monkeypatch.setattr(envs, "VLLM_ENABLE_CUDAGRAPH_GC", True, raising=False)
    freeze_heap()
    with _vllms_capture_context():
        assert gc.isenabled()  # vLLM's opt-out: the collector runs during the capture
    assert gc.get_freeze_count() > 0  # vLLM's opt-out freezes nothing and unfreezes nothing
