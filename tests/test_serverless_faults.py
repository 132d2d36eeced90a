"""Failures a real engine cannot produce on demand, driven through a FakeEngine (named as such)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.fakes import FakeEngine
from tests.helpers import engine_settings, job_items, worker_for
from worker.errors import EngineBootError
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker

JOB = {"prompt": "hi", "sampling_params": {"max_tokens": 3}}


async def collect(worker: ServerlessWorker, job_input: Any = JOB, job_id: str = "j") -> list[dict[str, Any]]:
    return await job_items(worker, {"id": job_id, "input": job_input})


def _all_ask_first(holder: EngineHolder, monkeypatch: pytest.MonkeyPatch, num_jobs: int) -> asyncio.Event:
    """An event set once ``num_jobs`` jobs have asked the holder for the engine: a boot that waits
    for it overlaps every one of them."""
    get, asked, everyone = holder.get, [0], asyncio.Event()

    async def counted() -> Any:
        asked[0] += 1
        if asked[0] == num_jobs:
            everyone.set()
        return await get()

    monkeypatch.setattr(holder, "get", counted)
    return everyone


async def test_concurrent_first_jobs_boot_the_engine_once(monkeypatch: pytest.MonkeyPatch) -> None:
    boots = 0

    async def factory(settings: Any) -> FakeEngine:
        nonlocal boots
        boots += 1
        await asyncio.wait_for(everyone.wait(), 60)
        return FakeEngine()

    holder = EngineHolder(settings_loader=engine_settings, engine_factory=factory)
    everyone = _all_ask_first(holder, monkeypatch, 10)
    worker = ServerlessWorker(holder)
    results = await asyncio.gather(*(collect(worker, job_id=f"j{i}") for i in range(10)))
    assert boots == 1
    assert all(items[-1]["finish_reason"] == "length" for items in results)


async def test_failed_boot_fails_every_job_clearly_and_asks_for_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    boots = 0

    async def factory(settings: Any) -> FakeEngine:
        nonlocal boots
        boots += 1
        await asyncio.wait_for(everyone.wait(), 60)
        raise EngineBootError("engine failed to start for model 'x': out of memory")

    holder = EngineHolder(settings_loader=engine_settings, engine_factory=factory)
    everyone = _all_ask_first(holder, monkeypatch, 5)
    worker = ServerlessWorker(holder)
    results = await asyncio.gather(*(collect(worker, job_id=f"j{i}") for i in range(5)))
    later = await collect(worker)
    assert boots == 1  # a boot that failed is not retried by every later job
    for items in [*results, later]:
        assert items == [
            {"error": "engine failed to start for model 'x': out of memory", "error_type": "engine_boot_error"}
        ]
    assert worker.runpod_config.get("refresh_worker") is True


async def test_a_boot_error_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    # The holder logs the boot's failure; the jobs it fails say only that the worker asks to be replaced.
    async def factory(settings: Any) -> FakeEngine:
        raise EngineBootError("engine failed to start for model 'x': out of memory")

    worker = ServerlessWorker(EngineHolder(settings_loader=engine_settings, engine_factory=factory))
    with caplog.at_level("INFO"):
        for job_id in ("first", "second"):
            assert (await collect(worker, job_id=job_id))[0]["error_type"] == "engine_boot_error"
    logged = [record.getMessage() for record in caplog.records if record.levelno >= 30]
    assert [line for line in logged if "out of memory" in line] == [
        "engine boot failed: engine failed to start for model 'x': out of memory"
    ]
    assert logged[1:] == ["asking RunPod to replace this worker: its engine did not start (the boot's error above)"]


async def test_unexpected_boot_exception_is_reported_without_traceback() -> None:
    async def factory(settings: Any) -> FakeEngine:
        raise RuntimeError("CUDA error: device-side assert")

    worker = ServerlessWorker(EngineHolder(settings_loader=engine_settings, engine_factory=factory))
    items = await collect(worker)
    assert items[0]["error_type"] == "engine_boot_error"
    assert "RuntimeError" in items[0]["error"] and "Traceback" not in items[0]["error"]
    assert worker.runpod_config.get("refresh_worker") is True


async def test_bad_configuration_fails_the_job_naming_the_variable() -> None:
    worker = ServerlessWorker(EngineHolder(settings_loader=lambda: engine_settings(MAX_MODEL_LEN="lots")))
    items = await collect(worker)
    assert "MAX_MODEL_LEN" in items[0]["error"]
    assert items[0]["error_type"] == "configuration_error"
    assert worker.runpod_config.get("refresh_worker") is True
    assert worker.concurrency_modifier(0) == 1


async def test_a_refused_configuration_is_parsed_once() -> None:
    """The SDK asks the concurrency modifier every tick: a refused environment is read once, not
    once a tick (each read would log its warnings again), and every later job gets the same error."""
    reads = 0

    def loader() -> Any:
        nonlocal reads
        reads += 1
        return engine_settings(MAX_MODEL_LEN="lots")

    worker = ServerlessWorker(EngineHolder(settings_loader=loader))
    for _ in range(3):
        assert worker.concurrency_modifier(0) == 1
    first, second = await collect(worker), await collect(worker)
    assert first[0]["error"] == second[0]["error"] and "MAX_MODEL_LEN" in first[0]["error"]
    assert reads == 1


async def test_engine_death_mid_stream_ends_the_job_with_an_error() -> None:
    fake = FakeEngine(words=10, die_after=3)

    worker = worker_for(fake)
    items = await collect(worker)
    assert items[0] == {"text": "w0 "}
    assert items[-1]["error_type"] == "engine_dead"
    assert worker.runpod_config.get("refresh_worker") is True
    # No job is left hanging on a dead engine: the next one fails at once.
    later = await asyncio.wait_for(collect(worker), 5)
    assert later[0]["error_type"] == "engine_dead"


async def test_unexpected_engine_exception_is_a_generic_error() -> None:
    class Exploding(FakeEngine):
        async def generate(self, request: Any, *, request_id: str | None = None) -> Any:
            raise KeyError("internal detail")
            yield  # pragma: no cover

    worker = worker_for(Exploding())
    items = await collect(worker)
    assert items == [{"error": "internal error (KeyError)", "error_type": "server_error"}]
    assert "refresh_worker" not in worker.runpod_config
    assert (await collect(worker, job_id="next"))[0]["error_type"] == "server_error"
