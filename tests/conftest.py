"""Shared fixtures: the tiny models (built once per machine) and real CPU engines."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.config import Settings, load_settings
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker
from worker.tiny_models import TinyModels, ensure_tiny_models

CACHE_DIR = Path(os.environ.get("WORKER_CACHE_DIR", str(Path.home() / ".cache" / "runpod-vllm-worker")))
# Variables the worker reads; each test starts without them (engines get explicit settings).
_WORKER_ENV = {name.upper() for name in Settings.model_fields} | {"RUNPOD_WEBHOOK_GET_JOB"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _WORKER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    return ensure_tiny_models(CACHE_DIR)


def engine_settings(**env: Any) -> Settings:
    values = {"WORKER_CACHE_DIR": str(CACHE_DIR), "MAX_NUM_SEQS": "16"}
    values.update({key: str(value) for key, value in env.items()})
    return load_settings(values)


def worker_for(engine: Any, **env: Any) -> ServerlessWorker:
    """A serverless worker serving ``engine``, already booted (a real engine or a FakeEngine)."""

    async def factory(_: Settings) -> Any:
        return engine

    return ServerlessWorker(EngineHolder(settings_loader=lambda: engine_settings(**env), engine_factory=factory))


async def boot_engine(tiny_models: TinyModels, **env: Any) -> Any:
    from worker.engine import Engine

    return await Engine.boot(engine_settings(**env))


@pytest.fixture(scope="session")
def subprocess_env(tiny_models: TinyModels) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k.upper() not in _WORKER_ENV}
    env["WORKER_CACHE_DIR"] = str(CACHE_DIR)
    yield env


@pytest.fixture(scope="session")
async def default_engine(tiny_models: TinyModels) -> AsyncIterator[Any]:
    """The embedded default: tiny target with the noisy-copy draft (k=3)."""
    engine = await boot_engine(tiny_models)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
async def plain_engine(tiny_models: TinyModels) -> AsyncIterator[Any]:
    """The tiny target without speculation."""
    engine = await boot_engine(tiny_models, MODEL_NAME="tiny:target")
    yield engine
    engine.shutdown()
