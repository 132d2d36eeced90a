"""worker.boot.heap: the boot's heap frozen without a full collection on the first job's path."""

from __future__ import annotations

import gc
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


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations the collector collects while the test runs; the heap unfrozen after it."""
    generations: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            generations.append(info["generation"])

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
    assert collections and max(collections) < 2, collections  # no walk of the whole heap


def test_the_boots_last_garbage_is_collected_before_freezing(collections: list[int]) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first  # a cycle: only the collector frees it
    gone = weakref.ref(first)
    del first, second
    freeze_heap()
    assert gone() is None


def test_the_heap_is_frozen_before_vllm_starts_its_engine_core(
    collections: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serverless worker forks its engine core: the child inherits the frozen heap, so vLLM's full
    collections during its boot skip what the parent allocated. The engine's start is replaced by a
    recorder (a real start on the CPU build spawns, where nothing is inherited to show)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from worker.boot import launch as boot
    from worker.errors import EngineBootError

    frozen_at_start: list[int] = []

    def record(  # the parameters the seam's contract checks for
        vllm_config: Any,
        disable_log_stats: bool = False,
        usage_context: Any = None,
        client_addresses: Any = None,
        client_count: int = 1,
        client_index: int = 0,
        **_: Any,
    ) -> None:
        frozen_at_start.append(gc.get_freeze_count())
        raise RuntimeError("the engine core's start, recorded")

    monkeypatch.setattr(AsyncLLM, "from_vllm_config", record)
    num_tracked = len(gc.get_objects())
    settings = load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR)})
    with pytest.raises(EngineBootError, match="recorded"):
        boot.create_engine(build_plan(settings, mode="serverless"))
    assert frozen_at_start and frozen_at_start[0] >= num_tracked * 0.9


def test_an_import_runs_without_the_collector_and_leaves_the_heap_frozen(collections: list[int]) -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    with imports_uncollected():
        assert not gc.isenabled()
        grown = [_Node() for _ in range(100_000)]  # what would start collections with the collector on
    assert collections[:2] == [0, 1] and max(collections) < 2, collections  # freeze_heap's, none before
    assert gc.isenabled() and gone() is None and gc.get_freeze_count() >= len(grown)


def test_a_failed_import_gives_the_collector_back(collections: list[int]) -> None:
    with pytest.raises(ImportError), imports_uncollected():
        import worker.no_such_module  # noqa: F401
    assert gc.isenabled()
