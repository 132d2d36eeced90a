"""Shared fixtures: the tiny models (built once per machine) and real CPU engines."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.helpers import CACHE_DIR, LORA_ENV, boot_engine
from worker.config import Settings
from worker.tiny_models import TinyModels, ensure_tiny_models

# Variables the worker reads; each test starts without them (engines get explicit settings).
_WORKER_ENV = {name.upper() for name in Settings.model_fields} | {"RUNPOD_WEBHOOK_GET_JOB"}


# Fixtures that boot an engine or a server: a test that asks for one must be marked slow, so
# that `pytest -m "not slow"` (the development lane) never boots anything.
_BOOTING_FIXTURES = {
    "default_engine",
    "plain_engine",
    "spec_engine",
    "both",
    "plain",
    "pod",
    "pod_and_worker",
    "awq_model",
}


# The session's shared engines: every test that uses one runs in one pytest-xdist worker, so
# each boots once per run, not once per worker.
_SESSION_ENGINES = {"default_engine", "plain_engine"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if _BOOTING_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None
    ]
    if unmarked:
        raise pytest.UsageError("tests that boot an engine must be marked slow: " + ", ".join(unmarked))
    # Groups for `--dist loadgroup` (pyproject's addopts): the session engines' tests together;
    # a module's tests together where they share a module-scoped server or model; the rest spread
    # one by one over the workers.
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & _SESSION_ENGINES:
            item.add_marker(pytest.mark.xdist_group("session-engines"))
        elif used & _BOOTING_FIXTURES:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _WORKER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    return ensure_tiny_models(CACHE_DIR)


@pytest.fixture(scope="session")
def subprocess_env(tiny_models: TinyModels) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k.upper() not in _WORKER_ENV}
    env["WORKER_CACHE_DIR"] = str(CACHE_DIR)
    yield env


@pytest.fixture(scope="session")
async def default_engine(tiny_models: TinyModels) -> AsyncIterator[Any]:
    """The embedded default (tiny target, the noisy-copy draft, k=3) with a tiny LoRA adapter
    loadable by name: one engine for every test that needs no configuration of its own."""
    engine = await boot_engine(tiny_models, **LORA_ENV)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
async def plain_engine(tiny_models: TinyModels) -> AsyncIterator[Any]:
    """The tiny target without speculation (it samples at any temperature on a CPU too)."""
    engine = await boot_engine(tiny_models, MODEL_NAME="tiny:target")
    yield engine
    engine.shutdown()
