"""Load, faults and shutdown against the real engine: nothing lost, nothing left running.

The figures (requests, errors, latency percentiles, faults injected) are printed as one JSON line
per test with the prefix RELIABILITY, so that a run's own output documents it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import (
    Pod,
    alive_after,
    boot_engine,
    descendants,
    engine_core_of,
    engine_settings,
    free_port,
    job_items,
    kill_while_jobs_stream,
    start_pod,
    tiny_default,
    worker_for,
)
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker

pytestmark = pytest.mark.slow  # every test here boots an engine or a server

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-reliability-test-key-1234567890"
HF_TOKEN = "hf_reliabilityTestTokenValue0987654321"
MODEL = "tiny:target"


def report(name: str, **figures: Any) -> None:
    print("RELIABILITY " + json.dumps({"test": name, **figures}))


async def _one(client: httpx.AsyncClient, pod: Pod, i: int) -> dict[str, Any]:
    stream = i % 2 == 0
    body = {
        "model": MODEL,
        "prompt": f"Request {i}: once upon a time",
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    started = time.perf_counter()
    try:
        if not stream:
            response = await client.post(pod.base + "/v1/completions", json=body, headers=pod.headers)
            outcome = (
                "ok"
                if response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 24
                else (f"http_{response.status_code}")
            )
            if response.status_code == 429:
                assert response.headers.get("retry-after")
        else:
            async with client.stream("POST", pod.base + "/v1/completions", json=body, headers=pod.headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    outcome = f"http_{response.status_code}"
                    if response.status_code == 429:
                        assert response.headers.get("retry-after")
                else:
                    lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
                    usage = [json.loads(x[6:]) for x in lines[:-1] if '"usage"' in x]
                    complete = lines[-1] == "data: [DONE]" and usage and usage[-1]["usage"]["completion_tokens"] == 24
                    outcome = "ok" if complete else "incomplete"
    except httpx.HTTPError as exc:
        outcome = f"transport_{type(exc).__name__}"
    return {"i": i, "outcome": outcome, "seconds": time.perf_counter() - started}


@pytest.mark.timeout(600)
def test_load_backpressure_secrets_and_graceful_sigterm(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    with start_pod(
        subprocess_env,
        tmp_path,
        API_KEY=API_KEY,
        HF_TOKEN=HF_TOKEN,
        MAX_NUM_SEQS="4",
        MAX_QUEUE_DEPTH="4",
        SHUTDOWN_GRACE_S="60",
    ) as pod:

        async def load() -> list[dict[str, Any]]:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                semaphore = asyncio.Semaphore(24)

                async def guarded(i: int) -> dict[str, Any]:
                    # A client that backs off when told to (429 + Retry-After) and gives up after 60 s
                    # of refusals: a budget in time, not in tries, so that a slower machine (requests
                    # that take longer, slots that free later) does not turn patience into failures.
                    async with semaphore:
                        rejected = 0
                        give_up_at = time.perf_counter() + 60
                        while True:
                            result = await _one(client, pod, i)
                            if result["outcome"] != "http_429" or time.perf_counter() > give_up_at:
                                break
                            rejected += 1
                            await asyncio.sleep(0.25)
                        return {**result, "rejected": rejected}

                return await asyncio.gather(*(guarded(i) for i in range(300)))

        results = asyncio.run(load())
        outcomes: dict[str, int] = {}
        for r in results:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        assert len({r["i"] for r in results}) == 300  # every request answered exactly once
        assert set(outcomes) <= {"ok", "http_429"}, outcomes  # a result or a clear back-pressure error
        num_rejected = sum(r["rejected"] for r in results)
        assert outcomes.get("ok", 0) >= 250 and num_rejected > 0, (outcomes, num_rejected)
        ok_seconds = sorted(r["seconds"] for r in results if r["outcome"] == "ok")
        deadline = time.time() + 20
        while time.time() < deadline and pod.in_engine() != 0:
            time.sleep(0.2)
        assert pod.in_engine() == 0
        report(
            "pod_load",
            requests=300,
            concurrency=24,
            max_num_seqs=4,
            queue_depth=4,
            outcomes=outcomes,
            p50_s=statistics.median(ok_seconds),
            p99_s=ok_seconds[int(0.99 * (len(ok_seconds) - 1))],
        )

        # Secrets: a refused key and a good request; neither the key nor the HF token reaches the log.
        assert httpx.get(pod.base + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401

        # SIGTERM with a request in flight: it finishes, then the server and its engine exit cleanly.
        engine_processes = descendants(pod.proc.pid)
        last = {
            "model": MODEL,
            "prompt": "The",
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        rest = pod.stream_through(last, lambda: pod.proc.send_signal(signal.SIGTERM), timeout_s=120)
        assert rest[-1] == "data: [DONE]", rest[-3:]
        assert not any('"error"' in line for line in rest)
        # uvicorn re-raises the signal it was stopped by once it has drained: "terminated by SIGTERM".
        assert pod.proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert not alive_after(engine_processes, 30), "orphaned engine processes"
        log = pod.log.read_text(errors="replace")
        assert API_KEY not in log and HF_TOKEN not in log
        assert "Request 1: once upon a time" not in log  # prompts are not logged
        report("pod_sigterm", in_flight_completed=True, exit_code=pod.proc.returncode, orphans=0, secrets_in_log=0)


@pytest.mark.timeout(400)
def test_pod_engine_death_fails_in_flight_and_exits_nonzero(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    with start_pod(subprocess_env, tmp_path, API_KEY=API_KEY) as pod:
        body = {
            "model": MODEL,
            "prompt": "The",
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        # A request vLLM's layer does not stream, in flight beside the stream when the core dies.
        unstreamed = ThreadPoolExecutor(1).submit(
            httpx.post,
            pod.base + "/v1/completions",
            json={**body, "stream": False},
            headers=pod.headers,
            timeout=60,
        )

        def kill_with_both_in_flight() -> None:
            deadline = time.time() + 30
            while pod.in_engine() < 2 and time.time() < deadline:
                time.sleep(0.05)
            os.kill(engine_core_of(pod.proc.pid), signal.SIGKILL)

        started = time.perf_counter()
        rest = pod.stream_through(body, kill_with_both_in_flight, timeout_s=60)
        ended_after = time.perf_counter() - started
        assert any('"error"' in line for line in rest) or rest == ["(connection closed)"], rest[-3:]
        answer = unstreamed.result(timeout=60)
        # The typed engine-dead error serverless jobs get, not vLLM's handler failing on its server.
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["type"] == "engine_dead", answer.text
        statuses = []
        deadline = time.time() + 30
        while pod.proc.poll() is None and time.time() < deadline:
            try:
                statuses.append(httpx.get(pod.base + "/health", timeout=2).status_code)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert pod.proc.wait(timeout=60) == 1
        assert 503 in statuses and 200 not in statuses[-3:]
        report(
            "pod_engine_death",
            in_flight_ended_s=round(ended_after, 2),
            health_503_seen=True,
            exit_code=pod.proc.returncode,
        )


async def test_serverless_engine_death_fails_jobs_and_asks_for_replacement(tiny_models: Any) -> None:
    # Other engines of this test session (shared fixtures) may be alive: kill only this one's core.
    before = set(descendants(os.getpid()))
    engine = await boot_engine(tiny_models, MODEL_NAME="tiny:target", SPECULATIVE_METHOD="none")
    own = set(descendants(os.getpid())) - before

    worker = worker_for(engine)
    job = {"prompt": "The", "sampling_params": {"max_tokens": 900, "ignore_eos": True}}
    try:
        # Killed as soon as every job streams (900 tokens take about a second on a fast CPU).
        results, _ = await kill_while_jobs_stream(
            worker, job, lambda: os.kill(engine_core_of(os.getpid(), among=own), signal.SIGKILL)
        )
        for items in results:
            assert items[-1].get("error_type") == "engine_dead", items[-1]
        assert worker.runpod_config.get("refresh_worker") is True
        later = await job_items(worker, {"id": "after", "input": job})
        assert later[-1]["error_type"] == "engine_dead"
        report("serverless_engine_death", in_flight_jobs=3, all_failed_cleanly=True, refresh_worker=True)
    finally:
        engine.shutdown()


async def test_boot_failure_is_bounded_and_clear(tmp_path: Path) -> None:
    for env, needle, error_type in [
        ({"MODEL_NAME": str(tmp_path / "no-such-model")}, "no-such-model", "engine_boot_error"),
        (  # the boot's draft check fails it, and the job's error names the setting
            {"MODEL_NAME": "tiny:target", "SPECULATIVE_MODEL": "tiny:mismatch", "NUM_SPECULATIVE_TOKENS": "2"},
            "cannot draft",
            "configuration_error",
        ),
    ]:  # an engine core that dies while starting: tests/test_entrypoints.py (a process of its own)
        worker = ServerlessWorker(EngineHolder(settings_loader=functools.partial(engine_settings, **env)))
        started = time.perf_counter()
        items = await asyncio.wait_for(asyncio.gather(*(_collect(worker, i) for i in range(3))), 120)
        for job_result in items:
            assert job_result[-1]["error_type"] == error_type and needle in job_result[-1]["error"]
            assert "root cause above" not in job_result[-1]["error"], job_result[-1]
        assert worker.runpod_config.get("refresh_worker") is True
        report("boot_failure", case=needle, seconds=round(time.perf_counter() - started, 2))


async def _collect(worker: ServerlessWorker, i: int) -> list[dict[str, Any]]:
    return await job_items(worker, {"id": f"b{i}", "input": {"prompt": "hi"}})


@pytest.mark.timeout(600)
def test_load_through_the_sdk_local_api(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """``python handler.py --rp_serve_api`` as users run it (the embedded default, speculating): a
    job's streamed items aggregated with its stats, a bad input named, then 200 jobs at a
    concurrency above max_num_seqs, and SIGTERM leaving no engine process behind."""
    port = free_port()
    log = tmp_path / "rp-serve-api.log"
    env = tiny_default({**subprocess_env, "MAX_NUM_SEQS": "8"})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "handler.py", "--rp_serve_api", "--rp_api_port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        async def load() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as client:
                deadline = time.time() + 120
                while True:  # the API answers before the engine boots; the first job boots it
                    try:
                        await client.get(base + "/docs")
                        break
                    except httpx.TransportError:
                        assert time.time() < deadline and proc.poll() is None, log.read_text()[-2000:]
                        await asyncio.sleep(0.5)
                job = {"prompt": "Once upon a time", "sampling_params": {"max_tokens": 12, "temperature": 0}}
                first = (await client.post(base + "/runsync", json={"input": job})).json()
                assert first["status"] == "COMPLETED", first
                items = first["output"]  # return_aggregate_stream: every streamed item
                assert "".join(i["text"] for i in items).startswith(", a small model")
                assert items[-1]["usage"]["completion_tokens"] == 12 and items[-1]["spec_decode"]["num_spec_steps"] > 0
                bad = {"input": {"prompt": "x", "sampling_params": {"top_k": "many"}}}
                refused = (await client.post(base + "/runsync", json=bad)).json()
                assert "sampling_params.top_k" in refused["output"][0]["error"]
                semaphore = asyncio.Semaphore(24)

                async def one(i: int) -> dict[str, Any]:
                    job = {
                        "input": {
                            "prompt": f"Job {i}: once upon a time",
                            "stream": i % 2 == 0,
                            "sampling_params": {"max_tokens": 16, "ignore_eos": True, "temperature": 0},
                        }
                    }
                    async with semaphore:
                        started = time.perf_counter()
                        response = await client.post(base + "/runsync", json=job)
                        body = response.json()
                        output = body.get("output") or [{}]
                        final = output[-1] if isinstance(output, list) else output
                        complete = (
                            body.get("status") == "COMPLETED" and final.get("usage", {}).get("completion_tokens") == 16
                        )
                        return {"i": i, "complete": complete, "seconds": time.perf_counter() - started}

                return await asyncio.gather(*(one(i) for i in range(200)))

        results = asyncio.run(load())
        assert len({r["i"] for r in results}) == 200
        incomplete = [r for r in results if not r["complete"]]
        assert not incomplete, incomplete[:3]
        seconds = sorted(r["seconds"] for r in results)
        report(
            "sdk_local_api_load",
            requests=200,
            concurrency=24,
            max_num_seqs=8,
            complete=200 - len(incomplete),
            p50_s=statistics.median(seconds),
            p99_s=seconds[int(0.99 * (len(seconds) - 1))],
        )
        engine_processes = descendants(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not alive_after(engine_processes, 30)
    # The SDK at its default level (DEBUG) would print every streamed item, users' text included.
    assert "Async Generator output" not in log.read_text()


# An adapter vLLM cannot load: `vllm serve` refuses to start with it, and so does the worker.
BAD_LORA = {
    "MODEL_NAME": "tiny:target",
    "SPECULATIVE_METHOD": "none",
    "ENABLE_LORA": "true",
    "LORA_MODULES": "good=tiny:lora bad=/nonexistent/path",
}


def _names_the_bad_adapter(error: str) -> bool:
    return "LORA_MODULES" in error and "'bad'" in error and "/nonexistent/path" in error and "Traceback" not in error


async def test_a_lora_module_that_cannot_load_fails_serverless_jobs_with_a_configuration_error() -> None:
    """Left to the first request naming it, the adapter failed inside the engine's step: that job
    got `engine_dead` and every later one too. Loaded at boot, each job gets the configuration
    error naming the setting and the path, and RunPod is asked for another worker."""
    worker = ServerlessWorker(EngineHolder(settings_loader=functools.partial(engine_settings, **BAD_LORA)))
    for i, job in enumerate([{"prompt": "hi"}, {"prompt": "hi", "lora": "bad"}, {"prompt": "hi", "lora": "good"}]):
        items = await asyncio.wait_for(job_items(worker, {"id": f"lora{i}", "input": job}), 120)
        assert items[-1]["error_type"] == "configuration_error", items[-1]
        assert _names_the_bad_adapter(items[-1]["error"]), items[-1]
    assert worker.runpod_config.get("refresh_worker") is True


def test_a_lora_module_that_cannot_load_never_lets_the_pod_report_ready(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """The pod answered `/health` 200 "ready", then a bare 500 on every route. Now an adapter path
    that does not exist is refused before the pod listens (worker/boot/preflight.py): `/health`
    never says 200, and the process exits 2 with the sentence naming the adapter."""
    port = free_port()
    log = tmp_path / "pod.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "serve", "--port", str(port)],
            cwd=Path(__file__).resolve().parent.parent,
            env=tiny_default({**subprocess_env, **BAD_LORA}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    statuses = set()
    deadline = time.monotonic() + 240
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                statuses.add(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code)
            except httpx.HTTPError:
                pass  # not listening yet, or gone
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.wait(timeout=30) == 2, log.read_text()[-3000:]
    assert 200 not in statuses, statuses
    text = log.read_text()
    assert any(_names_the_bad_adapter(line) for line in text.splitlines()), text[-3000:]
