"""worker.boot.heap: the boot's heap frozen without a full collection on the first job's path."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from worker.boot.heap import freeze_heap


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
