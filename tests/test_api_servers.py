"""A pod over several API server processes (``API_SERVER_COUNT=2``): one engine core, two API
processes sharing the listening socket, against the real engine on the CPU.

What the pod adds must hold across processes: back-pressure counted over all of them, the API
key, one ``/metrics`` page with every process's requests, exact stats for a stop-string ending,
LoRA by name, SIGTERM draining every process, and an engine-core death taking the whole pod down
with status 1. Two pods boot here: one serves every test up to its SIGTERM, the other dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import LORA_ENV, Pod, alive_after, cmdline, descendants, engine_core_of, start_pod

pytestmark = pytest.mark.slow  # every test here boots a pod

API_KEY = "sk-api-servers-test-key-0123456789"
MODEL = "tiny:target"
MAX_NUM_SEQS, MAX_QUEUE_DEPTH = 4, 4


@pytest.fixture(scope="module")
def pod(subprocess_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    env = {
        "API_SERVER_COUNT": "2",
        "API_KEY": API_KEY,
        "MAX_NUM_SEQS": str(MAX_NUM_SEQS),
        "MAX_QUEUE_DEPTH": str(MAX_QUEUE_DEPTH),
        "SHUTDOWN_GRACE_S": "60",
        **LORA_ENV,
    }
    with start_pod(subprocess_env, tmp_path_factory.mktemp("api-servers"), **env) as pod:
        yield pod


def _completion(**body: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Once upon a time", "temperature": 0, **body}


def test_the_pod_is_ready_only_once_every_api_process_is(pod: Pod) -> None:
    # The fixture returned at the first /health 200. Each process boots its own engine client and
    # logs when it is ready: both had by then (a process still booting answers 503 to requests),
    # and /health on either process (fresh connections go to the less loaded one) says so.
    assert pod.log.read_text().count("engine ready in") == 2
    with httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for _ in range(6):
            response = client.get(pod.base + "/health")
            assert response.status_code == 200 and response.json()["api_processes_ready"] == "2/2", response.text


def test_the_pod_runs_two_api_processes_over_one_engine_core(pod: Pod) -> None:
    names = [cmdline(pid) for pid in descendants(pod.proc.pid)]
    assert sum("APIServer" in name for name in names) == 2, names
    assert sum("EngineCore" in name for name in names) == 1, names


def test_back_pressure_counts_the_requests_of_every_process(pod: Pod) -> None:
    # 40 streams at once against 4 running + 4 waiting allowed in all: vLLM's server class hands
    # each new connection to the least loaded process, so both processes take some. Counted per
    # process, up to 16 would start; counted over both, 8 (one more if both admit at one instant).
    async def burst() -> list[tuple[int, list[str]]]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits, headers=pod.headers) as client:

            async def one(i: int) -> tuple[int, list[str]]:
                body = _completion(prompt=f"Story {i}:", max_tokens=200, ignore_eos=True, stream=True)
                async with client.stream("POST", pod.base + "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        await response.aread()
                        assert response.status_code != 429 or response.headers.get("retry-after")
                        return response.status_code, []
                    return 200, [line async for line in response.aiter_lines() if line.startswith("data: ")]

            return await asyncio.gather(*(one(i) for i in range(40)))

    results = asyncio.run(burst())
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    assert MAX_NUM_SEQS + MAX_QUEUE_DEPTH <= statuses.count(200) <= MAX_NUM_SEQS + MAX_QUEUE_DEPTH + 1, statuses
    for status, lines in results:
        if status == 200:  # every admitted stream ends complete: nothing lost
            assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines), lines[-3:]
    deadline = time.monotonic() + 20
    while pod.in_engine() != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pod.in_engine() == 0


def test_every_process_asks_for_the_key(pod: Pod) -> None:
    for _ in range(6):  # new connections: both processes answer some
        assert httpx.get(pod.base + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(pod.base + "/v1/models").status_code == 401
        assert httpx.get(pod.base + "/v1/models", headers=pod.headers).status_code == 200


def test_metrics_sum_every_process_and_a_stop_string_ending_is_exact(pod: Pod) -> None:
    finished = pod.metric('worker_requests_total{outcome="finished"}')
    # The same greedy request cut by a stop string and by max_tokens at its last kept token: the
    # first ends in the frontend, the second in the engine core, with vLLM's own counts of the same
    # steps; both carry the same stats, whichever process served each.
    prompt = "He counted one, two,"
    by_stop = httpx.post(
        pod.base + "/v1/completions",
        json=_completion(prompt=prompt, max_tokens=60, stop=["seven"]),
        headers=pod.headers,
        timeout=60,
    ).json()
    assert by_stop["choices"][0]["stop_reason"] == "seven", by_stop
    by_length = httpx.post(
        pod.base + "/v1/completions",
        json=_completion(prompt=prompt, max_tokens=by_stop["usage"]["completion_tokens"]),
        headers=pod.headers,
        timeout=60,
    ).json()
    assert by_length["choices"][0]["finish_reason"] == "length", by_length
    stats = by_stop["metrics"]["speculative_decoding"]
    assert stats["num_spec_steps"] > 0 and stats == by_length["metrics"]["speculative_decoding"]
    requests = 8
    for _ in range(requests - 2):
        response = httpx.post(pod.base + "/v1/completions", json=_completion(max_tokens=4), headers=pod.headers)
        assert response.status_code == 200, response.text
    # Every scrape is a new connection, answered by either process: each sums both processes' files.
    for _ in range(4):
        assert pod.metric('worker_requests_total{outcome="finished"}') == finished + requests
    page = httpx.get(pod.base + "/metrics").text
    assert "vllm:request_success_total" in page and "worker_request_acceptance_length_bucket" in page


def test_lora_adapters_are_served_by_name(pod: Pod) -> None:
    models = httpx.get(pod.base + "/v1/models", headers=pod.headers).json()
    assert {m["id"] for m in models["data"]} == {MODEL, "tiny-lora"}
    texts = set()
    for model in ("tiny-lora", MODEL, "tiny-lora", MODEL):
        body = _completion(model=model, max_tokens=8, ignore_eos=True)
        response = httpx.post(pod.base + "/v1/completions", json=body, headers=pod.headers, timeout=60)
        assert response.status_code == 200, response.text
        texts.add((model, response.json()["choices"][0]["text"]))
    assert len(texts) == 2  # each model answers the same way on either process, and they differ


def test_sigterm_drains_every_process_and_leaves_none(pod: Pod) -> None:
    processes = descendants(pod.proc.pid)
    body = _completion(max_tokens=300, ignore_eos=True, stream=True)
    rest = pod.stream_through(body, lambda: pod.proc.send_signal(signal.SIGTERM), timeout_s=120)
    assert rest[-1] == "data: [DONE]", rest[-3:]
    assert not any('"error"' in line for line in rest)
    assert pod.proc.wait(timeout=90) == 0
    assert not alive_after(processes, 30), "processes left after SIGTERM"
    assert "Exception ignored" not in pod.log.read_text(errors="replace")  # nothing left to tear down at exit


def test_engine_core_death_ends_the_whole_pod_with_status_1(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    # The API process serving the stream is told of the death by the pod's first process (its own
    # client watches no engine process): the stream ends with an error at once, not when a SIGTERM's
    # grace has run out (an hour here: a stream that waited for it fails the test on its timeout).
    env = {"API_SERVER_COUNT": "2", "MODEL_NAME": MODEL, "SPECULATIVE_METHOD": "none", "SHUTDOWN_GRACE_S": "3600"}
    with start_pod(subprocess_env, tmp_path, **env) as pod:
        processes = descendants(pod.proc.pid)
        body = _completion(max_tokens=900, ignore_eos=True, stream=True)
        rest = pod.stream_through(body, lambda: os.kill(engine_core_of(pod.proc.pid), signal.SIGKILL), timeout_s=300)
        assert any('"error"' in line for line in rest), rest[-3:]
        assert pod.proc.wait(timeout=60) == 1
        assert not alive_after(processes, 30), "processes left after the engine core died"
