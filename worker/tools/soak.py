"""``python -m worker soak``: mixed traffic for a bounded time against the pod and the serverless
handler, watching for anything that grows.

    python -m worker soak --minutes 60 --out docs/cpu-results/soak     # soak.json + soak.png there

Two servers start as users run them, on loopback, over the embedded tiny models with a LoRA
adapter: the pod (``python -m worker serve``, speculating with the noisy draft: exact stats on
stop strings) and the handler under the RunPod SDK's local API (``python handler.py
--rp_serve_api``, with ``METRICS_PORT`` for its gauges; without speculation, so that it samples
and serves ``n`` > 1 on a CPU, where sampling with speculation is refused). Client
loops send a seeded mix to each: streamed and whole answers, clients that disconnect mid-stream,
bad inputs, stop strings, ``n`` > 1, forced tool calls, the LoRA adapter, image parts (refused:
the tiny models read text only; one names the cloud metadata address, which the media guard
refuses) and bursts past the pod's admission limit (429s). Every request is classified: ``ok``,
an intended refusal, an intended disconnect, or **lost** (a 5xx, a transport error, a timeout,
an answer of the wrong shape).

Every ``--sample-every`` seconds it records each server process's RSS, open descriptors and
threads (the API process and vLLM's engine core) and vLLM's running / waiting / KV-usage gauges.
At the end the load stops, the engines must go idle (0 running, 0 waiting, KV usage back to its
value before the load), and SIGTERM must leave no process behind.

Goals (``summary.goals``): 0 lost; RSS growth from ``--warmup-minutes`` to the end ≤ 5% per
process; descriptors and threads flat (the end value at most 2 above the value at the warm-up
mark: thread pools may hold one more thread); the engines idle at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.tools.bench.servers import free_port, wait_until_ready

__all__ = ["SoakResult", "main", "run_soak"]

ROOT = Path(__file__).resolve().parents[2]
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
MODEL = "tiny:target"
ADAPTER = "tiny-lora"
# A 1x1 PNG: a valid image part, which the text-only tiny models refuse with a 400.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
    )
).decode()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    }
]
OK, REFUSED, DISCONNECTED = "ok", "refused", "disconnected"
INTENDED = (OK, REFUSED, DISCONNECTED)


class Lost(Exception):
    """An answer that is neither a result nor an intended error."""


@dataclass
class SoakResult:
    summary: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "ENABLE_LORA": "true",
            "LORA_MODULES": f"{ADAPTER}=tiny:lora",
            "MAX_NUM_SEQS": "4",
            "MAX_QUEUE_DEPTH": "8",
            "LOG_LEVEL": "WARNING",
        }
    )
    return env


# ---------------------------------------------------------------------------------- the traffic
def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise Lost(what)


def _status(response: Any, *, refused: tuple[int, ...] = ()) -> str | None:
    """None for a 200; REFUSED for an intended refusal in OpenAI's error shape; else Lost."""
    if response.status_code == 200:
        return None
    if response.status_code in refused:
        body = response.json()
        _check(isinstance(body.get("error", {}).get("message"), str), f"{response.status_code} without a message")
        return REFUSED
    raise Lost(f"HTTP {response.status_code}: {response.text[:200]}")


async def _sse(client: Any, url: str, body: dict[str, Any], *, read_events: int | None = None) -> list[Any] | str:
    """The events of a streamed answer, REFUSED on a 429, or DISCONNECTED after ``read_events``."""
    async with client.stream("POST", url, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return _status(response, refused=(429,)) or REFUSED
        events: list[Any] = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return events
            event = json.loads(line[6:])
            _check("error" not in event, f"error event: {line[:200]}")
            events.append(event)
            if read_events is not None and len(events) >= read_events:
                return DISCONNECTED  # leaving the block closes the connection mid-stream
    raise Lost("stream ended without [DONE]")


class PodTraffic:
    def __init__(self, base: str) -> None:
        self.base = base

    async def chat_stream(self, client: Any, rng: random.Random) -> str:
        body = _chat("Tell me a story.", max_tokens=rng.randint(8, 48), stream_options={"include_usage": True})
        events = await _sse(client, self.base + "/v1/chat/completions", body)
        if isinstance(events, str):
            return events
        usage = events[-1].get("usage") or {}
        _check(usage.get("completion_tokens", 0) >= 1, "no usage chunk")
        _check(events[-1]["metrics"]["speculative_decoding"]["num_spec_steps"] >= 1, "no acceptance stats")
        return OK

    async def completion(self, client: Any, rng: random.Random) -> str:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": rng.randint(4, 48), "temperature": 0}
        response = await client.post(self.base + "/v1/completions", json=body)
        refused = _status(response, refused=(429,))
        if refused:
            return refused
        answer = response.json()
        _check(answer["usage"]["completion_tokens"] >= 1 and isinstance(answer["choices"][0]["text"], str), "no text")
        return OK

    async def disconnect(self, client: Any, rng: random.Random) -> str:
        body = _chat("Count to one hundred.", max_tokens=200, ignore_eos=True)
        outcome = await _sse(client, self.base + "/v1/chat/completions", body, read_events=rng.randint(1, 4))
        _check(outcome in (DISCONNECTED, REFUSED), "the stream ended before the client left")
        return str(outcome)

    async def bad_input(self, client: Any, rng: random.Random) -> str:
        url = self.base + "/v1/chat/completions"
        case = rng.randrange(4)
        if case == 0:
            response = await client.post(url, content=b'{"model": "tiny:target", "messages": [', headers=_JSON)
        elif case == 1:
            response = await client.post(url, json=_chat("x", max_tokens="many"))
        elif case == 2:
            response = await client.post(url, json={**_chat("x"), "model": "gpt-4"})
        else:
            response = await client.post(self.base + "/v1/completions", content=b"\xff\xfe{", headers=_JSON)
        _check(response.status_code in (400, 404, 429), f"bad input answered {response.status_code}")
        return _status(response, refused=(400, 404, 429)) or OK

    async def stop_string(self, client: Any, rng: random.Random) -> str:
        body = {"model": MODEL, "prompt": "He counted one, two,", "max_tokens": 60, "temperature": 0, "stop": ["seven"]}
        response = await client.post(self.base + "/v1/completions", json=body)
        refused = _status(response, refused=(429,))
        if refused:
            return refused
        answer = response.json()
        _check(answer["choices"][0]["stop_reason"] == "seven", f"no stop: {answer['choices'][0]}")
        _check(answer["metrics"]["speculative_decoding"]["num_spec_steps"] >= 1, "a stop string's stats missing")
        return OK

    async def n_choices(self, client: Any, rng: random.Random) -> str:
        """``n`` > 1 on the speculating pod: vLLM refuses it greedy, and the CPU build cannot sample
        with speculation (the worker refuses it): a 400 that names the reason, either way."""
        body = {"model": MODEL, "prompt": "The sky", "max_tokens": 8, "temperature": rng.choice([0, 0.8]), "n": 2}
        response = await client.post(self.base + "/v1/completions", json=body)
        if response.status_code == 200:
            _check(sorted(c["index"] for c in response.json()["choices"]) == [0, 1], "not two choices")
            return OK
        message = response.json().get("error", {}).get("message", "")
        _check(response.status_code == 429 or "n must be 1" in message or "speculative" in message, message[:200])
        return REFUSED

    async def tool_call(self, client: Any, rng: random.Random) -> str:
        choice = {"type": "function", "function": {"name": "get_weather"}}
        body = _chat("Weather in Oslo?", max_tokens=100, tools=TOOLS, tool_choice=choice)
        response = await client.post(self.base + "/v1/chat/completions", json=body)
        refused = _status(response, refused=(429,))
        if refused:
            return refused
        (call,) = response.json()["choices"][0]["message"]["tool_calls"]
        _check(isinstance(json.loads(call["function"]["arguments"]), dict), "tool arguments are not an object")
        return OK

    async def lora(self, client: Any, rng: random.Random) -> str:
        body = {"model": ADAPTER, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
        response = await client.post(self.base + "/v1/completions", json=body)
        refused = _status(response, refused=(429,))
        if refused:
            return refused
        _check(response.json()["model"] == ADAPTER, "answered by another model")
        return OK

    async def image(self, client: Any, rng: random.Random) -> str:
        url = f"data:image/png;base64,{PNG}" if rng.random() < 0.5 else "http://169.254.169.254/latest/meta-data"
        content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
        body = {**_chat(""), "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        response = await client.post(self.base + "/v1/chat/completions", json=body)
        _check(response.status_code in (400, 429), f"an image part answered {response.status_code}")
        return _status(response, refused=(400, 429)) or OK

    async def burst(self, client: Any, rng: random.Random) -> list[str]:
        """More requests at once than the pod admits: each is answered or refused with a 429."""
        return list(await asyncio.gather(*(self.completion(client, rng) for _ in range(12))))

    def mix(self) -> list[tuple[Callable[[Any, random.Random], Awaitable[Any]], int]]:
        return [
            (self.chat_stream, 6),
            (self.completion, 5),
            (self.disconnect, 3),
            (self.bad_input, 3),
            (self.stop_string, 3),
            (self.n_choices, 2),
            (self.tool_call, 2),
            (self.lora, 2),
            (self.image, 2),
            (self.burst, 1),
        ]


_JSON = {"content-type": "application/json"}


class ServerlessTraffic:
    """Jobs through the SDK's local API: /runsync returns every streamed item of the job."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def _items(self, client: Any, job_input: Any, *, timeout: float | None = None) -> list[Any]:
        kwargs = {} if timeout is None else {"timeout": timeout}
        response = await client.post(self.base + "/runsync", json={"input": job_input}, **kwargs)
        if response.status_code == 422 and not isinstance(job_input, dict):
            # The SDK's local API takes only an object as input; RunPod passes any JSON to the handler.
            return [{"error": str(response.json()["detail"][0]["msg"]), "error_type": "sdk_validation"}]
        _check(response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        _check(body.get("status") == "COMPLETED", f"job status {body.get('status')}: {str(body)[:200]}")
        output = body["output"]
        _check(isinstance(output, list) and len(output) >= 1, "no output")
        return list(output)

    @staticmethod
    def _final(items: list[Any]) -> dict[str, Any]:
        final = items[-1]
        _check(isinstance(final, dict) and "error" not in final, f"error item: {str(final)[:300]}")
        _check(final["usage"]["completion_tokens"] >= 1, "no usage")
        return dict(final)

    async def native_stream(self, client: Any, rng: random.Random) -> str:
        job = {"prompt": "Once upon a time", "sampling_params": {"max_tokens": rng.randint(4, 48), "temperature": 0}}
        self._final(await self._items(client, job))
        return OK

    async def native_whole(self, client: Any, rng: random.Random) -> str:
        job = {
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": False,
            "sampling_params": {"max_tokens": rng.randint(4, 32), "temperature": 0.7, "seed": rng.randrange(1000)},
        }
        items = await self._items(client, job)
        _check(len(items) == 1, "a whole answer came in pieces")
        self._final(items)
        return OK

    async def stop_string(self, client: Any, rng: random.Random) -> str:
        job = {
            "prompt": "He counted one, two,",
            "sampling_params": {"max_tokens": 60, "temperature": 0, "stop": ["seven"]},
        }
        final = self._final(await self._items(client, job))
        _check(final["stop_reason"] == "seven", f"no stop: {final.get('finish_reason')}")
        return OK

    async def bad_input(self, client: Any, rng: random.Random) -> str:
        job = rng.choice(
            [
                {"prompt": "x", "sampling_params": {"top_k": "many"}},
                {"prompt": 5},
                {"messages": [{"role": "robot", "content": "x"}]},
                "not an object",
                {"openai_route": "/v1/nothing", "openai_input": {}},
            ]
        )
        items = await self._items(client, job)
        _check(isinstance(items[-1], dict) and isinstance(items[-1].get("error"), str), f"not refused: {items[-1]}")
        return REFUSED

    async def openai_chat(self, client: Any, rng: random.Random) -> str:
        streamed = rng.random() < 0.5
        body = _chat("Hello", max_tokens=rng.randint(4, 24), stream=streamed)
        items = await self._items(client, {"openai_route": "/v1/chat/completions", "openai_input": body})
        if streamed:
            _check(all(isinstance(i, str) for i in items) and items[-1].endswith("data: [DONE]\n\n"), "no [DONE]")
        else:
            _check(items[0]["usage"]["completion_tokens"] >= 1, "no usage")
        return OK

    async def n_choices(self, client: Any, rng: random.Random) -> str:
        body = {
            "model": MODEL,
            "prompt": "The sky",
            "max_tokens": 8,
            "temperature": 0.8,
            "n": 2,
            "seed": rng.randrange(1000),
        }
        items = await self._items(client, {"openai_route": "/v1/completions", "openai_input": body})
        _check(sorted(c["index"] for c in items[0]["choices"]) == [0, 1], "not two choices")
        return OK

    async def lora(self, client: Any, rng: random.Random) -> str:
        job = {"prompt": "Once upon a time", "lora": ADAPTER, "sampling_params": {"max_tokens": 12, "temperature": 0}}
        self._final(await self._items(client, job))
        return OK

    async def image(self, client: Any, rng: random.Random) -> str:
        content = [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]
        body = {**_chat(""), "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        items = await self._items(client, {"openai_route": "/v1/chat/completions", "openai_input": body})
        _check(isinstance(items[-1], dict) and isinstance(items[-1].get("error"), str), "an image part was served")
        return REFUSED

    async def run_then_stream(self, client: Any, rng: random.Random) -> str:
        """/run, then /stream/{id}: the SDK's local API runs the job when its stream is asked for."""
        job = {"prompt": "Once upon a time", "sampling_params": {"max_tokens": 16, "temperature": 0}}
        queued = (await client.post(self.base + "/run", json={"input": job})).json()
        body = (await client.post(self.base + f"/stream/{queued['id']}")).json()
        _check(body.get("status") == "COMPLETED", f"stream status {body.get('status')}")
        self._final([item["output"] for item in body["stream"]])
        return OK

    async def disconnect(self, client: Any, rng: random.Random) -> str:
        """The client gives up on a job mid-way (the local API, unlike RunPod, has no cancel: the job
        still runs to its end in the worker)."""
        job = {"prompt": "Count", "sampling_params": {"max_tokens": 120, "ignore_eos": True, "temperature": 0}}
        import httpx

        try:
            await self._items(client, job, timeout=rng.uniform(0.05, 0.5))
        except httpx.TimeoutException:
            return DISCONNECTED
        return OK

    def mix(self) -> list[tuple[Callable[[Any, random.Random], Awaitable[Any]], int]]:
        return [
            (self.native_stream, 6),
            (self.native_whole, 4),
            (self.stop_string, 3),
            (self.bad_input, 3),
            (self.openai_chat, 3),
            (self.n_choices, 2),
            (self.lora, 2),
            (self.image, 1),
            (self.run_then_stream, 2),
            (self.disconnect, 2),
        ]


# ---------------------------------------------------------------------------------- the servers
@dataclass
class Server:
    role: str
    proc: subprocess.Popen[bytes]
    metrics_url: str
    log_path: Path

    def processes(self) -> list[Any]:
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _start(role: str, args: list[str], env: dict[str, str], log_path: Path, metrics_url: str) -> Server:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Server(role, proc, metrics_url, log_path)


def _stop(servers: list[Server]) -> list[int]:
    """SIGTERM each server; return the pids of its processes still alive 60 s later."""
    pids = [p.pid for server in servers for p in server.processes()]
    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            server.proc.send_signal(signal.SIGTERM)
    for server in servers:
        try:
            server.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
    time.sleep(1)
    import psutil

    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def _gauges(text: str) -> dict[str, float]:
    values = dict.fromkeys(GAUGES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


def _process_name(index: int, process: Any) -> str:
    if index == 0:
        return "api"
    with contextlib.suppress(Exception):
        name = str(process.name())
        return "engine-core" if "EngineCore" in name else name
    return "child"


async def _sample(client: Any, servers: list[Server], elapsed_s: float, counts: Counter[str]) -> dict[str, Any]:
    sample: dict[str, Any] = {"t_s": round(elapsed_s, 1), "processes": {}, "gauges": {}, "outcomes": dict(counts)}
    for server in servers:
        for index, process in enumerate(server.processes()):
            with contextlib.suppress(Exception):
                with process.oneshot():
                    key = f"{server.role}:{_process_name(index, process)}"
                    if key in sample["processes"]:
                        key = f"{key}:{process.pid}"
                    sample["processes"][key] = {
                        "rss_mib": round(process.memory_info().rss / 2**20, 1),
                        "fds": process.num_fds(),
                        "threads": process.num_threads(),
                    }
        try:
            sample["gauges"][server.role] = _gauges((await client.get(server.metrics_url, timeout=10)).text)
        except Exception as exc:  # a sample is an observation: its absence is reported, not fatal
            sample["gauges"][server.role] = {"error": f"{type(exc).__name__}: {exc}"}
    return sample


# ---------------------------------------------------------------------------------- the run
async def _client_loop(
    name: str,
    traffic: PodTraffic | ServerlessTraffic,
    client: Any,
    rng: random.Random,
    stop_at: float,
    counts: Counter[str],
    lost: list[str],
) -> None:
    scenarios, weights = zip(*traffic.mix(), strict=True)
    while time.perf_counter() < stop_at:
        scenario = rng.choices(scenarios, weights)[0]
        key = f"{name}.{scenario.__name__}"
        try:
            outcome = await asyncio.wait_for(scenario(client, rng), timeout=180)
        except Exception as exc:  # every other ending is a lost request, named
            counts[f"{key}:lost"] += 1
            lost.append(f"{key}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        for one in outcome if isinstance(outcome, list) else [outcome]:
            counts[f"{key}:{one}"] += 1


async def _wait_idle(client: Any, servers: list[Server], idle: dict[str, dict[str, float]], timeout_s: float) -> bool:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        now = {s.role: _gauges((await client.get(s.metrics_url, timeout=10)).text) for s in servers}
        if all(_is_idle(now[role], idle[role]) for role in now):
            return True
        await asyncio.sleep(1)
    return False


def _is_idle(gauges: dict[str, float], idle: dict[str, float]) -> bool:
    return (
        gauges["vllm:num_requests_running"] == 0
        and gauges["vllm:num_requests_waiting"] == 0
        and abs(gauges["vllm:kv_cache_usage_perc"] - idle["vllm:kv_cache_usage_perc"]) < 1e-9
    )


async def _drive(
    servers: list[Server], bases: dict[str, str], *, minutes: float, sample_every_s: float, clients: int, seed: int
) -> tuple[list[dict[str, Any]], Counter[str], list[str], dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=180, limits=limits) as client:
        # Both engines booted and warm before the clock starts: the handler boots at its first job.
        wait_until_ready(bases["pod"], servers[0].proc, timeout_s=600)
        serverless = ServerlessTraffic(bases["serverless"])
        deadline = time.perf_counter() + 600
        while True:
            try:
                await serverless.native_stream(client, random.Random(0))
                break
            except (httpx.TransportError, Lost):
                if servers[1].proc.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError(f"the handler did not serve; see {servers[1].log_path}") from None
                await asyncio.sleep(1)
        idle = {s.role: _gauges((await client.get(s.metrics_url, timeout=10)).text) for s in servers}
        counts: Counter[str] = Counter()
        lost: list[str] = []
        samples = [await _sample(client, servers, 0.0, counts)]
        started = time.perf_counter()
        stop_at = started + minutes * 60
        pod = PodTraffic(bases["pod"])
        loops = [
            _client_loop(f"{name}", traffic, client, random.Random(f"{seed}-{name}-{i}"), stop_at, counts, lost)
            for i in range(clients)
            for name, traffic in (("pod", pod), ("serverless", serverless))
        ]
        load = asyncio.gather(*loops)
        while not load.done():
            await asyncio.wait([load], timeout=sample_every_s)
            samples.append(await _sample(client, servers, time.perf_counter() - started, counts))
        await load
        went_idle = await _wait_idle(client, servers, idle, timeout_s=60)
        samples.append(await _sample(client, servers, time.perf_counter() - started, counts))
        end = {"idle_before": idle, "idle_at_end": went_idle, "load_s": round(time.perf_counter() - started, 1)}
        return samples, counts, lost, end


def _growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, dict[str, Any]]:
    """Per process: each series' value at the warm-up mark, at the end and its peak after the mark."""
    mark = next((s for s in samples if s["t_s"] >= warmup_s), samples[0])
    last = samples[-1]
    out: dict[str, dict[str, Any]] = {}
    for key, at_mark in mark["processes"].items():
        if key not in last["processes"]:
            continue
        after = [s["processes"][key] for s in samples if s["t_s"] >= mark["t_s"] and key in s["processes"]]
        end = last["processes"][key]
        out[key] = {
            "rss_mib": [at_mark["rss_mib"], end["rss_mib"]],
            "rss_growth_pct": round(100 * (end["rss_mib"] / at_mark["rss_mib"] - 1), 2),
            "rss_peak_mib": max(p["rss_mib"] for p in after),
            "fds": [at_mark["fds"], end["fds"]],
            "fds_peak": max(p["fds"] for p in after),
            "threads": [at_mark["threads"], end["threads"]],
            "threads_peak": max(p["threads"] for p in after),
        }
    return out


def run_soak(
    *,
    minutes: float,
    out_dir: Path,
    sample_every_s: float = 30.0,
    warmup_minutes: float = 10.0,
    clients: int = 4,
    seed: int = 0,
    env: dict[str, str] | None = None,
) -> SoakResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    ports = {"pod": free_port(), "serverless": free_port(), "metrics": free_port()}
    bases = {role: f"http://127.0.0.1:{ports[role]}" for role in ("pod", "serverless")}
    pod_env = server_env(env)
    # The handler serves without speculation, so it samples (n > 1 too) on a CPU; the pod speculates.
    handler_env = {**server_env(env), "METRICS_PORT": str(ports["metrics"]), "SPECULATIVE_METHOD": "none"}
    servers = [
        _start(
            "pod",
            [sys.executable, "-m", "worker", "serve", "--port", str(ports["pod"])],
            pod_env,
            out_dir / "soak-pod.log",
            bases["pod"] + "/metrics",
        ),
        _start(
            "serverless",
            [sys.executable, "handler.py", "--rp_serve_api", "--rp_api_port", str(ports["serverless"])],
            handler_env,
            out_dir / "soak-serverless.log",
            f"http://127.0.0.1:{ports['metrics']}/metrics",
        ),
    ]
    try:
        samples, counts, lost, end = asyncio.run(
            _drive(servers, bases, minutes=minutes, sample_every_s=sample_every_s, clients=clients, seed=seed)
        )
    finally:
        left = _stop(servers)
    requests = sum(counts.values())
    by_outcome = Counter(key.rsplit(":", 1)[1] for key in counts.elements())
    growth = _growth(samples, warmup_minutes * 60)
    goals = {
        "lost_0": by_outcome["lost"] == 0,
        "rss_growth_le_5pct": all(g["rss_growth_pct"] <= 5 for g in growth.values()),
        "fds_flat": all(g["fds"][1] <= g["fds"][0] + 2 for g in growth.values()),
        "threads_flat": all(g["threads"][1] <= g["threads"][0] + 2 for g in growth.values()),
        "idle_at_end": bool(end["idle_at_end"]),
        "no_process_left": not left,
    }
    summary = {
        "command": " ".join(
            ["python -m worker soak", f"--minutes {minutes:g}", f"--warmup-minutes {warmup_minutes:g}"]
        ),
        "minutes": minutes,
        "warmup_minutes": warmup_minutes,
        "clients_per_server": clients,
        "requests": requests,
        "outcomes": dict(by_outcome),
        "by_scenario": dict(sorted(counts.items())),
        "lost": lost[:50],
        "growth": growth,
        "processes_left": left,
        **end,
        "goals": goals,
        "met": all(goals.values()),
    }
    result = SoakResult(summary, samples)
    (out_dir / "soak.json").write_text(json.dumps({"summary": summary, "samples": samples}, indent=1) + "\n")
    return result


def plot(result: SoakResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result.samples
    minutes = [s["t_s"] / 60 for s in samples]
    keys = sorted({key for s in samples for key in s["processes"]})
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    for ax, series, label in zip(
        axes[:3], ("rss_mib", "fds", "threads"), ("RSS (MiB)", "open fds", "threads"), strict=True
    ):
        for key in keys:
            ax.plot(minutes, [s["processes"].get(key, {}).get(series) for s in samples], label=key, marker=".")
        ax.set_ylabel(label)
        ax.axvline(result.summary["warmup_minutes"], color="grey", linestyle=":")
    axes[0].legend(fontsize=7, ncol=2)
    ax = axes[3]
    for role in ("pod", "serverless"):
        for gauge, style in (("vllm:num_requests_running", "-"), ("vllm:num_requests_waiting", "--")):
            values = [s["gauges"].get(role, {}).get(gauge) for s in samples]
            ax.plot(minutes, values, style, label=f"{role} {gauge.split(':')[1]}", marker=".")
    ax.set_ylabel("requests in engine")
    ax.set_xlabel("minutes")
    ax.legend(fontsize=7)
    summary = result.summary
    fig.suptitle(f"{summary['command']}: {summary['requests']} requests, outcomes {summary['outcomes']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the load runs (default 60)")
    parser.add_argument("--warmup-minutes", type=float, default=10.0, help="growth is measured from here (10)")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between samples (30)")
    parser.add_argument("--clients", type=int, default=4, help="client loops per server (4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("soak-results"), help="soak.json, soak.png and logs")
    args = parser.parse_args(argv)
    if not 0 < args.minutes <= 24 * 60 or not 0 <= args.warmup_minutes < args.minutes:
        parser.error("--minutes must be in (0, 1440] and --warmup-minutes below it")
    result = run_soak(
        minutes=args.minutes,
        out_dir=args.out,
        sample_every_s=args.sample_every,
        warmup_minutes=args.warmup_minutes,
        clients=args.clients,
        seed=args.seed,
    )
    plot(result, args.out / "soak.png")
    print(json.dumps({k: v for k, v in result.summary.items() if k != "by_scenario"}, indent=1))
    return 0 if result.summary["met"] else 1
