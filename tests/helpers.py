"""What tests share besides fixtures: settings and engines over the tiny models, and the process
and port helpers of the tests that start servers."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from worker import runtime
from worker.boot.engine_args import build_engine_kwargs, engine_environment
from worker.config import DeploymentMode, Settings, load_settings
from worker.runtime import EngineHolder, EngineProtocol
from worker.serverless import ServerlessWorker
from worker.speculation.decide import decide
from worker.tiny_models import TinyModels
from worker.tools.bench.servers import alive_after, free_port, wait_until_ready

if TYPE_CHECKING:
    from worker.engine import Engine

__all__ = [
    "CACHE_DIR",
    "LORA_ENV",
    "TINY_DEFAULT_SERVED",
    "TINY_DRAFT_ENV",
    "TINY_MODEL_ENV",
    "ImageServer",
    "Pod",
    "alive_after",
    "assert_engine_empties",
    "boot_engine",
    "cmdline",
    "descendants",
    "engine_core_of",
    "engine_env",
    "engine_kwargs",
    "engine_settings",
    "free_port",
    "job_items",
    "kill_while_jobs_stream",
    "png",
    "start_pod",
    "tiny_default",
    "wait_until_ready",
    "worker_for",
]

# What an unset MODEL_NAME served before the default became SmolLM2 (worker/smollm2.py), spelled out:
# the tiny target with its noisy-copy draft at k = 3, whose acceptance the tests know. Tests that do
# not name a model get it (:func:`tiny_default`); the default model's own tests name none.
TINY_MODEL_ENV = {"MODEL_NAME": "tiny:target"}
TINY_DRAFT_ENV = {"SPECULATIVE_MODEL": "tiny:noisy", "NUM_SPECULATIVE_TOKENS": "3"}
_SPECULATION_KNOBS = ("SPECULATIVE_METHOD", "SPECULATIVE_MODEL", "SPECULATIVE_CONFIG")


def tiny_default(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` over the tiny models where it names no model: the tiny target, and its noisy draft at
    k = 3 unless ``env`` configures speculation (as an unset MODEL_NAME once meant)."""
    if "MODEL_NAME" in env:
        return dict(env)
    draft = {} if any(name in env for name in _SPECULATION_KNOBS) else TINY_DRAFT_ENV
    return {**draft, **env, **TINY_MODEL_ENV}


# The session engine's LoRA adapter (tests of vLLM's OpenAI layer select it by name).
LORA_ENV = {"ENABLE_LORA": "true", "LORA_MODULES": "tiny-lora=tiny:lora"}


# The served block of the tiny models' set-up (TINY_MODEL_ENV and TINY_DRAFT_ENV) on the CPU: what the
# plan and the pod's /plan show.
TINY_DEFAULT_SERVED = {
    "model": "tiny:target",
    "quantization": None,
    "speculative_method": "draft_model",
    "num_speculative_tokens": 3,
    "speculation_control": "static",
    "model_runner": "cpu",
    "cudagraph_mode": "NONE",
    "torch_compile": False,
    "speculative_tokens_by_batch": None,
    "spec_decode_available": True,
}

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(os.environ.get("WORKER_CACHE_DIR", str(Path.home() / ".cache" / "runpod-vllm-worker")))


def engine_settings(**env: Any) -> Settings:
    """Settings over the tiny models (:func:`tiny_default`) unless ``env`` names a model."""
    values = {"WORKER_CACHE_DIR": str(CACHE_DIR), "MAX_NUM_SEQS": "16"}
    values.update({key: str(value) for key, value in env.items()})
    return load_settings(tiny_default(values))


def engine_kwargs(settings: Settings, *, mode: DeploymentMode = "serverless", is_cpu: bool = False) -> dict[str, Any]:
    """vLLM's engine arguments for ``settings`` as the boot plan builds them (references as named)."""
    return build_engine_kwargs(settings, decide(settings, mode=mode, is_cpu=is_cpu), is_cpu=is_cpu)


def engine_env(settings: Settings, *, mode: DeploymentMode, is_cpu: bool = False) -> dict[str, str | None]:
    """The engine's process environment for ``settings`` as the boot plan builds it."""
    return engine_environment(settings, decide(settings, mode=mode, is_cpu=is_cpu), mode=mode)


def worker_for(engine: EngineProtocol, **env: Any) -> ServerlessWorker:
    """A serverless worker serving ``engine``, already booted (a real engine or a FakeEngine)."""

    async def factory(_: Settings) -> EngineProtocol:
        return engine

    return ServerlessWorker(EngineHolder(settings_loader=lambda: engine_settings(**env), engine_factory=factory))


async def boot_engine(tiny_models: TinyModels, **env: Any) -> Engine:
    """A real CPU engine over the tiny models (``tiny_models``: the fixture that built them)."""
    return await runtime.boot_engine(engine_settings(**env), mode="serverless")


async def job_items(worker: ServerlessWorker, job: dict[str, Any]) -> list[Any]:
    """Every item a job yields. Typed loosely on purpose: the tests index into them, while the
    worker's own code tells its two item shapes apart (``worker.serverless.JobItem``)."""
    items: list[Any] = []
    async for item in worker.handle(job):
        items.append(item)
    return items


async def assert_engine_empties(engine: Any, timeout_s: float = 5.0) -> None:
    """Wait up to ``timeout_s`` for the engine to hold no request, then assert it holds none."""
    deadline = time.monotonic() + timeout_s
    while engine.num_unfinished_requests and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert engine.num_unfinished_requests == 0


async def wait_for_spec_snapshot(engine: Any, timeout_s: float = 60.0) -> None:
    """Wait until every running request's frontend state holds a spec-decode snapshot with a verify
    step in it (the engine core attaches one to every request every ``SNAPSHOT_EVERY_STEPS`` steps;
    one taken at the prompt's step has none): what a request cancelled from then on reports."""
    states = engine.llm.output_processor.request_states
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshots = [state.spec_decode_metrics for state in states.values()]
        if snapshots and all(m is not None and sum(m.histogram) > 0 for m in snapshots):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no spec-decode snapshot within {timeout_s} s")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[::2]), map(int, out[1::2]), strict=True))
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in pairs if pp == parent]
        found += children
        frontier += children
    return found


def cmdline(pid: int) -> str:
    """The process's command line as /proc shows it (a process title where one is set); "" once gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return ""


async def kill_while_jobs_stream(
    worker: ServerlessWorker, job: dict[str, Any], kill: Callable[[], None], *, num_jobs: int = 3, timeout_s: float = 60
) -> tuple[list[list[dict[str, Any]]], float]:
    """Start ``num_jobs`` copies of ``job``, call ``kill`` once every one of them streams, and
    return each job's items and the seconds from the kill until all had ended."""
    streaming = [asyncio.Event() for _ in range(num_jobs)]

    async def consume(i: int) -> list[dict[str, Any]]:
        items: list[Any] = []
        async for item in worker.handle({"id": f"dying-{i}", "input": job}):
            items.append(item)
            streaming[i].set()
        return items

    tasks = [asyncio.create_task(consume(i)) for i in range(num_jobs)]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in streaming)), timeout_s)
    killed_at = time.perf_counter()
    kill()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
    return list(results), time.perf_counter() - killed_at


def engine_cores_of(pid: int) -> list[int]:
    """The engine-core processes below ``pid``."""
    return [child for child in descendants(pid) if "EngineCore" in cmdline(child)]


def engine_core_of(pid: int, *, among: set[int] | None = None) -> int:
    """The engine-core process below ``pid`` (``among``: only these pids)."""
    for child in engine_cores_of(pid):
        if among is None or child in among:
            return child
    raise AssertionError("no engine-core process found")


def png(size: tuple[int, int], colour: tuple[int, int, int]) -> bytes:
    """A PNG of one colour."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


class ImageServer:
    """A loopback HTTP server that counts the requests it gets (``hits``): ``/img.png`` answers
    ``image``, ``/to?url`` redirects to ``url``. Stop it with :meth:`close`."""

    def __init__(self, image: bytes) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                if self.path.startswith("/to?"):
                    self.send_response(302)
                    self.send_header("Location", self.path[4:])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(image)))
                self.end_headers()
                self.wfile.write(image)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str = "/img.png", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Pod:
    """A pod server (``python -m worker serve``) in a subprocess, its output in ``log``."""

    def __init__(self, proc: subprocess.Popen[bytes], base: str, log: Path, *, api_key: str | None) -> None:
        self.proc, self.base, self.log = proc, base, log
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def metric(self, name: str) -> float:
        """One sample of the pod's ``/metrics`` page, by its name with labels (``a{b="c"}``)."""
        for line in httpx.get(self.base + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{name} missing from /metrics")

    def in_engine(self) -> float:
        return self.metric("worker_requests_in_engine")

    def stream_through(self, body: dict[str, Any], during: Callable[[], None], *, timeout_s: float) -> list[str]:
        """Stream a completion; once its first event has arrived, call ``during`` (a signal, a kill),
        then read the rest: its non-empty lines, or ``["(connection closed)"]`` if the connection broke."""
        with httpx.stream(
            "POST", self.base + "/v1/completions", json=body, headers=self.headers, timeout=timeout_s
        ) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            during()
            try:
                return [line for line in lines if line]
            except httpx.HTTPError:
                return ["(connection closed)"]


@contextlib.contextmanager
def start_pod(subprocess_env: dict[str, str], tmp_path: Path, **env: str) -> Iterator[Pod]:
    """A pod booted with ``env`` on a free port, ready; stopped with SIGTERM (then killed) after."""
    port = free_port()
    log = tmp_path / f"pod-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "serve", "--port", str(port)],
            cwd=ROOT,
            env=tiny_default({**subprocess_env, **env}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    pod = Pod(proc, f"http://127.0.0.1:{port}", log, api_key=env.get("API_KEY"))
    try:
        try:
            wait_until_ready(pod.base, proc, timeout_s=240)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}: {log.read_text()[-3000:]}") from None
        yield pod
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
