"""``python -m worker bench``: the worker against its peers, measured as ratios in one run.

Parts (``--parts``, default all):

- ``overhead``  the same N concurrent requests through the serverless handler's code path
                and straight into vLLM's ``AsyncLLM``, on one engine in one process,
                alternating paths; throughput, TTFT and inter-token-latency ratios.
- ``pod``       our pod server and ``python -m vllm.entrypoints.openai.api_server``, same
                engine arguments, started in turn, driven by the same streaming HTTP client.
- ``coldstart`` process start to first streamed token for ``python handler.py --test_input``
                and for vLLM's server (start plus first request); the handler's import time;
                where the time goes, from the engine's own log lines.
- ``spec``      tokens/s with each draft (target as its own draft, noisy copy, unrelated,
                n-gram) and k in {2, 4, 8} versus no speculation, with the measured acceptance.
- ``roofline``  the single-stream decode bound from bytes per step and memory bandwidth.

Writes ``bench.json``, ``bench.md`` and PNG plots under ``--out``. Nothing is typed by hand:
every figure in the Markdown comes from the JSON of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.config import Settings, load_settings
from worker.engine_args import build_engine_kwargs, model_ref
from worker.planners import PRESETS
from worker.sizing import GPUS, ModelShape, decode_roofline_tokens_per_s, kv_bytes_per_token, weight_bytes

if TYPE_CHECKING:
    from worker.engine import Engine

__all__ = ["RequestTiming", "main", "summarize"]

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Once upon a time"


@dataclass(slots=True)
class RequestTiming:
    start: float
    first_token: float | None = None
    end: float | None = None
    num_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def itl(self) -> float | None:
        if self.first_token is None or self.end is None or self.num_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.num_tokens - 1)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(timings: list[RequestTiming], wall: float) -> dict[str, Any]:
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    itls = [t.itl for t in timings if t.itl is not None]
    tokens = sum(t.num_tokens for t in timings)
    return {
        "requests": len(timings),
        "tokens": tokens,
        "wall_s": wall,
        "throughput_tok_s": tokens / wall if wall > 0 else None,
        "ttft_p50_ms": _ms(_pct(ttfts, 50)),
        "ttft_p99_ms": _ms(_pct(ttfts, 99)),
        "itl_mean_ms": _ms(statistics.fmean(itls)) if itls else None,
        "itl_p50_ms": _ms(_pct(itls, 50)),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


async def _run_concurrent(
    make: Callable[[int], Any], *, num_requests: int, concurrency: int
) -> tuple[list[RequestTiming], float]:
    semaphore = asyncio.Semaphore(concurrency)
    timings: list[RequestTiming] = []

    async def one(i: int) -> None:
        async with semaphore:
            timing = RequestTiming(start=time.perf_counter())
            await make(i)(timing)
            timings.append(timing)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(num_requests)))
    return timings, time.perf_counter() - started


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if not ours or not theirs else ours / theirs


# ------------------------------------------------------------------------------ overhead
def requests_for(concurrency: int, num_requests: int) -> int:
    """``num_requests``, or with 0 ("auto") two waves of the concurrency level (at least 8)."""
    return num_requests or max(8, 2 * concurrency)


async def bench_overhead(
    settings: Settings,
    *,
    concurrencies: list[int],
    num_requests: int,
    max_tokens: int,
    repeats: int,
    raw_input: str = "text",
    stats_off_baseline: bool = False,
) -> dict[str, Any]:
    """Handler vs raw AsyncLLM on one engine; with ``stats_off_baseline`` (a speculating config)
    also the handler over a second engine, identical but for the worker's exact-stats path
    (``PER_REQUEST_SPEC_DECODE_METRICS=none``: vLLM's plain scheduler), both engines booted side
    by side (half the GPU memory each) so that the paths can alternate within each repeat."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from worker.engine import Engine
    from worker.runtime import EngineHolder
    from worker.schema import parse_request
    from worker.serverless import ServerlessWorker

    stats_off_baseline = stats_off_baseline and settings.resolved_speculative_config() is not None
    if stats_off_baseline:
        settings = settings.model_copy(update={"gpu_memory_utilization": settings.gpu_memory_utilization / 2})
    engine = await Engine.boot(settings)
    engines = {"handler": engine}
    if stats_off_baseline:
        engines["handler_stats_off"] = await Engine.boot(
            settings.model_copy(update={"per_request_spec_decode_metrics": "none"})
        )
    served = engine.served.model_dump()
    # Both paths share the engine, hence its stream interval (tokens per engine output).
    stream_interval = engine.llm.vllm_config.scheduler_config.stream_interval
    job = {"prompt": PROMPT, "sampling_params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}

    def handler_path(over: Engine) -> Callable[[int], Callable[[RequestTiming], Any]]:
        async def factory(_: Settings) -> Engine:
            return over

        worker = ServerlessWorker(EngineHolder(settings_loader=lambda: settings, engine_factory=factory))
        return lambda i: handler_request(worker, i)

    def handler_request(worker: ServerlessWorker, i: int) -> Callable[[RequestTiming], Any]:
        async def run(timing: RequestTiming) -> None:
            async for item in worker.handle({"id": f"h{i}", "input": job}):
                if item.get("text") and timing.first_token is None:
                    timing.first_token = time.perf_counter()
                if "error" in item:
                    raise RuntimeError(item["error"])
                if "usage" in item:
                    timing.num_tokens = item["usage"]["completion_tokens"]
            timing.end = time.perf_counter()

        return run

    # The text prompt, as the handler gets it (AsyncLLM tokenizes it), or its token ids made once
    # (the handler's tokenization then counts as overhead).
    raw_prompt: Any = PROMPT
    if raw_input == "ids":
        raw_prompt = {"prompt_token_ids": engine.render_prompt(parse_request(job))}

    def raw_request(i: int) -> Callable[[RequestTiming], Any]:
        params = SamplingParams(
            max_tokens=max_tokens, ignore_eos=True, temperature=0, output_kind=RequestOutputKind.DELTA
        )

        async def run(timing: RequestTiming) -> None:
            async for out in engine.llm.generate(raw_prompt, params, f"raw{i}-{time.time_ns()}"):
                completion = out.outputs[0]
                # First visible text, as on the handler path (a token that decodes to nothing,
                # e.g. part of a multi-byte character, is not shown to anyone).
                if completion.text and timing.first_token is None:
                    timing.first_token = time.perf_counter()
                timing.num_tokens += len(completion.token_ids)
            timing.end = time.perf_counter()

        return run

    paths = {"handler": handler_path(engine), "vllm_asyncllm": raw_request}
    if stats_off_baseline:
        paths["handler_stats_off"] = handler_path(engines["handler_stats_off"])
    results: list[dict[str, Any]] = []
    try:
        for path in paths.values():  # warm-up: compile, prefix cache
            await _run_concurrent(path, num_requests=2, concurrency=2)
        for concurrency in concurrencies:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
            for rep in range(repeats):
                order = list(paths) if rep % 2 == 0 else list(reversed(paths))
                for name in order:
                    timings, wall = await _run_concurrent(
                        paths[name], num_requests=requests_for(concurrency, num_requests), concurrency=concurrency
                    )
                    runs[name].append(summarize(timings, wall))
            row: dict[str, Any] = {"concurrency": concurrency}
            for name, summaries in runs.items():
                row[name] = {key: _median([s[key] for s in summaries]) for key in summaries[0]}
            ours, theirs = row["handler"], row["vllm_asyncllm"]
            row["throughput_ratio"] = _ratio(ours["throughput_tok_s"], theirs["throughput_tok_s"])
            row["ttft_p50_ratio"] = _ratio(ours["ttft_p50_ms"], theirs["ttft_p50_ms"])
            row["itl_mean_ratio"] = _ratio(ours["itl_mean_ms"], theirs["itl_mean_ms"])
            if stats_off_baseline:
                off = row["handler_stats_off"]
                row["stats_throughput_ratio"] = _ratio(ours["throughput_tok_s"], off["throughput_tok_s"])
                row["stats_itl_ratio"] = _ratio(ours["itl_mean_ms"], off["itl_mean_ms"])
            results.append(row)
            print(f"overhead c={concurrency}: throughput ratio {row['throughput_ratio']:.3f}", flush=True)
        spec_exact = await _spec_exactness(engine, settings, job) if settings.resolved_speculative_config() else None
    finally:
        for booted in engines.values():
            booted.shutdown()
    return {
        "num_requests": num_requests or "auto",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "baseline_input": raw_input,
        "stream_interval": stream_interval,
        "stats_off_baseline": stats_off_baseline,
        "served": served,
        "spec_exact": spec_exact,
        "rows": results,
    }


async def _spec_exactness(
    engine: Engine, settings: Settings, job: dict[str, Any], *, requests: int = 16
) -> dict[str, Any]:
    """Concurrent handler jobs on a speculating engine: their per-request ``spec_decode`` summed,
    against vLLM's engine-wide counters over the same interval (nothing else runs on the engine)."""
    from worker.runtime import EngineHolder
    from worker.serverless import ServerlessWorker

    async def factory(_: Settings) -> Engine:
        return engine

    worker = ServerlessWorker(EngineHolder(settings_loader=lambda: settings, engine_factory=factory))
    before = _engine_spec_counters()

    async def one(i: int) -> dict[str, Any]:
        items = [item async for item in worker.handle({"id": f"exact{i}", "input": job})]
        return dict(items[-1].get("spec_decode") or {})

    finals = await asyncio.gather(*(one(i) for i in range(requests)))
    await asyncio.sleep(0.5)  # the frontend records a step's stats just after handing out its outputs
    after = _engine_spec_counters()
    counters = {key.removeprefix("vllm:spec_decode_"): int(after[key] - before[key]) for key in after}
    summed = {
        "num_drafts": sum(f.get("num_spec_steps", 0) for f in finals),
        "num_draft_tokens": sum(f.get("num_draft_tokens", 0) for f in finals),
        "num_accepted_tokens": sum(f.get("num_accepted_draft_tokens", 0) for f in finals),
    }
    return {
        "requests": requests,
        "with_spec_decode": sum(1 for f in finals if f),
        "per_request_sum": summed,
        "engine_counters": counters,
        "equal": summed == counters,
    }


def _median(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if numbers else None


# ------------------------------------------------------------------------------ servers
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vllm_server_args(settings: Settings, *, model_path: str, port: int) -> list[str]:
    """vLLM's own server with the engine arguments our worker builds (speculation excluded)."""
    kwargs = build_engine_kwargs(settings, resolve=lambda ref: model_path if ref == model_ref(settings) else ref)
    from worker.openai import server_flags

    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        *server_flags(settings),
    ]
    for key, value in kwargs.items():
        if key in ("disable_log_stats", "speculative_config", "per_request_spec_decode_metrics"):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


@contextlib.contextmanager
def _server(args: list[str], *, env: dict[str, str], base: str, log_path: Path) -> Iterator[float]:
    """Start a server, yield its seconds to ready (/health 200); stop it (SIGTERM) afterwards."""
    import httpx

    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = started + 600
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited during boot; see {log_path}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(base + "/health", timeout=2).status_code == 200:
                        break
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"server not ready in 600 s; see {log_path}")
                time.sleep(0.1)
            yield time.perf_counter() - started
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


async def _http_stream(client: Any, base: str, body: dict[str, Any], timing: RequestTiming) -> None:
    async with client.stream("POST", base + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text") and timing.first_token is None:
                timing.first_token = time.perf_counter()
            if event.get("usage"):
                timing.num_tokens = event["usage"]["completion_tokens"]
    timing.end = time.perf_counter()


async def _drive_http(
    base: str, *, model: str, concurrencies: list[int], num_requests: int, max_tokens: int, headers: dict[str, str]
) -> list[dict[str, Any]]:
    import httpx

    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    rows = []
    # A new connection per request: no stale keep-alive connection (uvicorn closes idle ones after 5 s).
    limits = httpx.Limits(max_connections=max(concurrencies) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, headers=headers, limits=limits) as client:

        def make(i: int) -> Callable[[RequestTiming], Any]:
            return lambda timing: _http_stream(client, base, body, timing)

        await _run_concurrent(make, num_requests=2, concurrency=2)  # warm-up
        for concurrency in concurrencies:
            timings, wall = await _run_concurrent(
                make, num_requests=requests_for(concurrency, num_requests), concurrency=concurrency
            )
            rows.append({"concurrency": concurrency, **summarize(timings, wall)})
    return rows


def bench_pod(
    settings: Settings,
    env: dict[str, str],
    *,
    model_path: str,
    out: Path,
    concurrencies: list[int],
    num_requests: int,
    max_tokens: int,
    repeats: int,
) -> dict[str, Any]:
    """The pod server and vLLM's own server booted side by side (half the GPU memory each, so both
    fit one GPU), then driven in turn, the order alternating per repeat: each figure is the median
    of ``repeats`` runs, and the two servers see the same machine state. Booting each server once
    per repeat instead cost ~70 s a boot on the H200, more than the measurements."""
    runs: dict[str, list[list[dict[str, Any]]]] = {"pod": [], "vllm_server": []}
    half = settings.model_copy(update={"gpu_memory_utilization": settings.gpu_memory_utilization / 2})
    bases: dict[str, str] = {}
    ready: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        for name in runs:
            port = _free_port()
            bases[name] = f"http://127.0.0.1:{port}"
            if name == "pod":
                args = [sys.executable, "-m", "worker", "serve", "--port", str(port)]
                server_env = {**env, "GPU_MEMORY_UTILIZATION": str(half.gpu_memory_utilization)}
            else:
                args = vllm_server_args(half, model_path=model_path, port=port)
                server_env = env
            # One after the other: two engines profiling GPU memory at once would each see the other's.
            ready[name] = stack.enter_context(
                _server(args, env=server_env, base=bases[name], log_path=out / f"{name}.log")
            )
            print(f"pod bench: {name} ready in {ready[name]:.1f} s", flush=True)
        for rep in range(repeats):
            for name in ["pod", "vllm_server"] if rep % 2 == 0 else ["vllm_server", "pod"]:
                rows = asyncio.run(
                    _drive_http(
                        bases[name],
                        model=settings.served_model_name,
                        concurrencies=concurrencies,
                        num_requests=num_requests,
                        max_tokens=max_tokens,
                        headers={},
                    )
                )
                runs[name].append(rows)
                print(f"pod bench: {name} rep {rep} done", flush=True)
                (out / "pod-runs.json").write_text(json.dumps(runs, indent=1))  # kept if a later run is cut short
    table = []
    for i, concurrency in enumerate(concurrencies):
        row: dict[str, Any] = {"concurrency": concurrency}
        for name, reps in runs.items():
            row[name] = {key: _median([r[i][key] for r in reps]) for key in reps[0][i] if key != "concurrency"}
        row["throughput_ratio"] = _ratio(row["pod"]["throughput_tok_s"], row["vllm_server"]["throughput_tok_s"])
        row["ttft_p50_ratio"] = _ratio(row["pod"]["ttft_p50_ms"], row["vllm_server"]["ttft_p50_ms"])
        row["ttft_p99_ratio"] = _ratio(row["pod"]["ttft_p99_ms"], row["vllm_server"]["ttft_p99_ms"])
        row["itl_mean_ratio"] = _ratio(row["pod"]["itl_mean_ms"], row["vllm_server"]["itl_mean_ms"])
        table.append(row)
    return {
        "num_requests": num_requests or "auto",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "ready_s": ready,
        "side_by_side": True,
        "rows": table,
    }


# ------------------------------------------------------------------------------ cold start
_LOG_MARKERS = {
    "weights_load_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took .*? and ([\d.]+) seconds",
    "torch_compile_s": r"torch\.compile takes ([\d.]+) s",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "compilation_s": r"\(compilation: ([\d.]+) s\)",
    "worker_engine_ready_s": r"engine ready in ([\d.]+) s",
}


def parse_boot_log(text: str) -> dict[str, float]:
    found = {}
    for name, pattern in _LOG_MARKERS.items():
        match = re.search(pattern, text)
        if match:
            found[name] = float(match.group(1))
    first_chunk = re.search(r"\[\s*([\d.]+)s\] (chunk|final)", text)  # the local test run's own timestamps
    if first_chunk:
        found["first_item_s"] = float(first_chunk.group(1))
    return found


def _boot_columns(found: dict[str, float]) -> str:
    """Weights load, engine init, compile, graph capture: whichever of vLLM's log lines a release prints."""
    load = found.get("weights_load_s", found.get("model_load_s"))
    compile_s = found.get("torch_compile_s", found.get("compilation_s"))
    return " | ".join(_f(v) for v in (load, found.get("engine_init_s"), compile_s, found.get("graph_capture_s")))


def render_saved(paths: list[Path]) -> str:
    """Markdown from saved results: bench JSON files (one section each, then a quantization
    summary) and boot logs (a cold-start breakdown row each)."""
    sections: list[str] = []
    quant_rows = []
    log_rows = []
    for path in paths:
        if path.suffix == ".log":
            found = parse_boot_log(path.read_text(errors="replace"))
            log_rows.append(
                f"| `{path.name}` | {_f(found.get('first_item_s'))} | {_f(found.get('worker_engine_ready_s'))} | "
                f"{_boot_columns(found)} |"
            )
            continue
        results = json.loads(path.read_text())
        sections.append(f"#### {results.get('label') or path.stem} (`{path.name}`)\n\n" + render_markdown(results))
        overhead, roofline = results.get("overhead"), results.get("roofline")
        if overhead and roofline:
            by_c = {r["concurrency"]: r for r in overhead["rows"]}
            bound = next((r for r in roofline["rows"] if "fraction_of_bound" in r), None)
            single, batch = by_c.get(1), by_c.get(256)
            interval = overhead.get("stream_interval") or 1
            label = path.stem + (f" (stream interval {interval})" if interval > 1 else "")
            quant_rows.append(
                f"| {label} | {roofline['weight_bytes_per_step'] / 1e9:.2f} | "
                f"{_f(bound['measured_tok_s'] if bound else None, 1)} | "
                f"{_f(bound['bound_tok_s'] if bound else None, 0)} | "
                f"{_f(bound['fraction_of_bound'] if bound else None, 3)} | "
                f"{_f(batch['handler']['throughput_tok_s'] if batch else None, 0)} | "
                f"{_f(batch['vllm_asyncllm']['throughput_tok_s'] if batch else None, 0)} | "
                f"{_f(single['throughput_ratio'] if single else None, 3)} / "
                f"{_f(batch['throughput_ratio'] if batch else None, 3)} |"
            )
    out = []
    if quant_rows:
        out += [
            "| config | weight GB read per step | batch-1 decode tok/s (handler) | roofline tok/s | fraction of "
            "roofline | batch-256 tok/s (handler) | batch-256 tok/s (AsyncLLM) | throughput ratio c=1 / c=256 |",
            "|---|---|---|---|---|---|---|---|",
            *quant_rows,
            "",
        ]
    if log_rows:
        out += [
            "| boot log | first item s | engine ready s | weights load s | engine init s | of which compile s | "
            "graph capture s |",
            "|---|---|---|---|---|---|---|",
            *log_rows,
            "",
        ]
    return "\n".join(out + sections)


def _import_seconds(env: dict[str, str], repeats: int = 5) -> float:
    code = "import time; t = time.perf_counter(); import handler; print(time.perf_counter() - t)"
    values = [
        float(
            subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(repeats)
    ]
    return statistics.median(values)


def bench_coldstart(
    settings: Settings, env: dict[str, str], *, model_path: str, out: Path, with_server: bool = True
) -> dict[str, Any]:
    import httpx

    job = json.dumps({"input": {"prompt": PROMPT, "sampling_params": {"max_tokens": 8, "temperature": 0}}})
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "handler.py", "--test_input", job],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first_token_s = None
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if first_token_s is None and "] chunk " in line:
            first_token_s = time.perf_counter() - started
    proc.wait()
    exit_s = time.perf_counter() - started
    log = "".join(lines)
    (out / "coldstart-handler.log").write_text(log)
    handler = {"first_token_s": first_token_s, "process_exit_s": exit_s, "breakdown": parse_boot_log(log)}
    if not with_server:
        return {"handler": handler, "handler_import_s": _import_seconds(env)}

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = out / "coldstart-vllm-server.log"
    started = time.perf_counter()
    with _server(
        vllm_server_args(settings, model_path=model_path, port=port), env=env, base=base, log_path=log_path
    ) as ready_s:
        timing = RequestTiming(start=time.perf_counter())

        async def first() -> None:
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"model": settings.served_model_name, "prompt": PROMPT, "max_tokens": 8, "stream": True}
                await _http_stream(client, base, body, timing)

        asyncio.run(first())
        server_first = (timing.first_token or time.perf_counter()) - started
    server = {"ready_s": ready_s, "first_token_s": server_first, "breakdown": parse_boot_log(log_path.read_text())}
    return {"handler": handler, "vllm_server": server, "handler_import_s": _import_seconds(env)}


# ------------------------------------------------------------------------------ speculative
async def _spec_point(settings: Settings, *, num_requests: int, max_tokens: int) -> dict[str, Any]:
    from worker.engine import Engine
    from worker.schema import parse_request

    engine = await Engine.boot(settings)
    try:
        prompts = [
            PROMPT,
            "The worker streams",
            "A GPU reads every weight",
            "He counted one, two, three, four, five, six, seven, eight, nine, ten. He counted one, two,",
        ]
        requests = [
            parse_request(
                {
                    "prompt": prompts[i % len(prompts)],
                    "sampling_params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                }
            )
            for i in range(num_requests)
        ]
        [c async for c in engine.generate(requests[0])]  # warm-up
        counters_before = _engine_spec_counters()
        drafted = accepted = steps = tokens = 0
        decode_s = 0.0
        for request in requests:
            first = None
            async for chunk in engine.generate(request):
                if chunk.num_tokens and first is None:
                    first = time.perf_counter()
                if chunk.is_final:
                    end = time.perf_counter()
                    assert chunk.usage is not None
                    tokens += chunk.usage.completion_tokens - 1
                    decode_s += end - (first or end)
                    if chunk.spec_decode is not None:
                        drafted += chunk.spec_decode.num_draft_tokens
                        accepted += chunk.spec_decode.num_accepted_draft_tokens
                        steps += chunk.spec_decode.num_spec_steps
        await asyncio.sleep(0.1)  # the frontend records a step's stats just after handing out its outputs
        after = _engine_spec_counters()
        counted = {key.removeprefix("vllm:spec_decode_"): int(after[key] - counters_before[key]) for key in after}
        return {
            "decode_tok_s": tokens / decode_s if decode_s else None,
            "engine_counters": counted,
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "num_spec_steps": steps,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / steps if steps else None,
            "accepted_per_step": accepted / steps if steps else None,
        }
    finally:
        engine.shutdown()


_SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def _engine_spec_counters() -> dict[str, float]:
    """vLLM's engine-wide spec-decode counters (Prometheus, this process), 0 where absent."""
    from prometheus_client import REGISTRY

    totals = dict.fromkeys(_SPEC_COUNTERS, 0.0)
    for family in REGISTRY.collect():
        if family.name in totals:
            totals[family.name] = sum(x.value for x in family.samples if x.name.endswith("_total"))
    return totals


def bench_spec(
    env: dict[str, str], *, drafts: list[str], ks: list[int], num_requests: int, max_tokens: int
) -> dict[str, Any]:
    base_env = {**env, "SPECULATIVE_METHOD": "none"}
    baseline = asyncio.run(_spec_point(load_settings(base_env), num_requests=num_requests, max_tokens=max_tokens))
    print(f"spec baseline: {baseline['decode_tok_s']:.1f} tok/s", flush=True)
    rows = []
    for draft in drafts:
        for k in ks:
            point_env = {key: value for key, value in env.items() if not key.startswith("SPECULATIVE_")}
            point_env["NUM_SPECULATIVE_TOKENS"] = str(k)
            if draft == "ngram":
                point_env["SPECULATIVE_METHOD"] = "ngram"
            else:
                point_env["SPECULATIVE_MODEL"] = draft
            point = asyncio.run(_spec_point(load_settings(point_env), num_requests=num_requests, max_tokens=max_tokens))
            point.update(draft=draft, k=k, speedup=_ratio(point["decode_tok_s"], baseline["decode_tok_s"]))
            point["pays_off"] = bool(point["speedup"] and point["speedup"] > 1.0)
            rows.append(point)
            print(
                f"spec {draft} k={k}: speedup {point['speedup']:.2f}, mean acceptance length "
                f"{point['mean_acceptance_length'] or 0:.2f}",
                flush=True,
            )
    return {"num_requests": num_requests, "max_tokens": max_tokens, "baseline": baseline, "rows": rows}


# ------------------------------------------------------------------------------ roofline
def checkpoint_quantization(model_path: str) -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        config = json.loads((Path(model_path) / "config.json").read_text())
        return str(config["quantization_config"]["quant_method"])
    return None


def bench_roofline(
    model_path: str,
    *,
    quantization: str | None,
    dtype: str,
    context_len: int,
    measured_tok_s: float | None,
    gpu: str | None,
) -> dict[str, Any]:
    shape = ModelShape.from_path(model_path)
    quantization = quantization or checkpoint_quantization(model_path)
    w_bytes = weight_bytes(shape, quantization=quantization, dtype=dtype)
    kv = kv_bytes_per_token(shape)
    rows = []
    for name, spec in GPUS.items():
        bound = decode_roofline_tokens_per_s(
            shape, bandwidth_gbs=spec["bandwidth_gbs"], context_len=context_len, quantization=quantization, dtype=dtype
        )
        row: dict[str, Any] = {"gpu": name, "bandwidth_gbs": spec["bandwidth_gbs"], "bound_tok_s": bound}
        if gpu == name and measured_tok_s:
            row["measured_tok_s"] = measured_tok_s
            row["fraction_of_bound"] = measured_tok_s / bound
        rows.append(row)
    return {
        "num_params": shape.num_params,
        "weight_bytes_per_step": w_bytes,
        "kv_bytes_per_token": kv,
        "context_len": context_len,
        "quantization": quantization,
        "dtype": dtype,
        "rows": rows,
    }


# ------------------------------------------------------------------------------ report
def write_report(results: dict[str, Any], out: Path) -> None:
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    (out / "bench.md").write_text(render_markdown(results))
    with contextlib.suppress(ImportError):
        _plots(results, out)


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render_markdown(results: dict[str, Any]) -> str:
    lines = [f"Command: `{results['command']}`", "", f"Machine: {results['machine']}", ""]
    if "overhead" in results:
        o = results["overhead"]
        lines += [
            "### Handler overhead (serverless code path vs vLLM AsyncLLM, one engine, one process)",
            "",
            f"{o['num_requests']} requests x {o['max_tokens']} tokens per concurrency level, median of "
            f"{o['repeats']} alternating runs. "
            + (
                "Both paths start from the same text prompt (AsyncLLM tokenizes it in `generate`)."
                if o.get("baseline_input") == "text"
                else "AsyncLLM was given the prompt's token ids, tokenized once; the handler tokenized every request."
            )
            + (
                f" Engine stream interval: {o['stream_interval']} token(s) per output, for both paths."
                if o.get("stream_interval")
                else ""
            ),
            "",
            "| concurrency | handler tok/s | AsyncLLM tok/s | throughput ratio | TTFT p50 ms (handler / raw) | "
            "ITL ms (handler / raw) | ITL ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in o["rows"]:
            h, v = r["handler"], r["vllm_asyncllm"]
            lines.append(
                f"| {r['concurrency']} | {_f(h['throughput_tok_s'], 1)} | {_f(v['throughput_tok_s'], 1)} | "
                f"{_f(r['throughput_ratio'], 3)} | {_f(h['ttft_p50_ms'], 1)} / {_f(v['ttft_p50_ms'], 1)} | "
                f"{_f(h['itl_mean_ms'], 2)} / {_f(v['itl_mean_ms'], 2)} | {_f(r['itl_mean_ratio'], 3)} |"
            )
        lines.append("")
        if o.get("stats_off_baseline"):
            lines += [
                "Cost of exact per-request stats: the handler over this engine vs over an identical one "
                "without the stats path (`PER_REQUEST_SPEC_DECODE_METRICS=none`, vLLM's plain scheduler), "
                "booted side by side, alternating in the same repeats. Target: throughput ratio >= 0.99, "
                "ITL ratio <= 1.01.",
                "",
                "| concurrency | stats on tok/s | stats off tok/s | throughput ratio | ITL ms (on / off) | ITL ratio |",
                "|---|---|---|---|---|---|",
            ]
            for r in o["rows"]:
                h, off = r["handler"], r["handler_stats_off"]
                lines.append(
                    f"| {r['concurrency']} | {_f(h['throughput_tok_s'], 1)} | {_f(off['throughput_tok_s'], 1)} | "
                    f"{_f(r['stats_throughput_ratio'], 3)} | {_f(h['itl_mean_ms'], 2)} / "
                    f"{_f(off['itl_mean_ms'], 2)} | {_f(r['stats_itl_ratio'], 3)} |"
                )
            lines.append("")
    if "pod" in results:
        p = results["pod"]
        lines += [
            "### Pod server vs vLLM's OpenAI server (same engine arguments, same streaming client)",
            "",
            f"{p['num_requests']} requests x {p['max_tokens']} tokens, `/v1/completions` streaming, median of "
            f"{p['repeats']} runs per server.",
            "",
            "| concurrency | pod tok/s | vLLM server tok/s | throughput ratio | TTFT p50 ms (pod / vLLM) | "
            "TTFT p99 ms (pod / vLLM) | ITL ms (pod / vLLM) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in p["rows"]:
            a, b = r["pod"], r["vllm_server"]
            lines.append(
                f"| {r['concurrency']} | {_f(a['throughput_tok_s'], 1)} | {_f(b['throughput_tok_s'], 1)} | "
                f"{_f(r['throughput_ratio'], 3)} | {_f(a['ttft_p50_ms'], 1)} / {_f(b['ttft_p50_ms'], 1)} | "
                f"{_f(a['ttft_p99_ms'], 1)} / {_f(b['ttft_p99_ms'], 1)} | "
                f"{_f(a['itl_mean_ms'], 2)} / {_f(b['itl_mean_ms'], 2)} |"
            )
        lines.append("")
    if "coldstart" in results:
        c = results["coldstart"]
        h, s = c["handler"], c["vllm_server"]
        lines += [
            "### Cold start (process start to first streamed token)",
            "",
            "| | first token s | engine ready s | weights load s | engine init (profile, KV, warm-up) s | "
            "compile s | graph capture s |",
            "|---|---|---|---|---|---|---|",
            f"| `python handler.py --test_input` | {_f(h['first_token_s'])} | "
            f"{_f(h['breakdown'].get('worker_engine_ready_s'))} | {_boot_columns(h['breakdown'])} |",
            f"| vLLM server + first request | {_f(s['first_token_s'])} | {_f(s['ready_s'])} | "
            f"{_boot_columns(s['breakdown'])} |",
            "",
            f"`import handler`: {_f(c['handler_import_s'] * 1000, 0)} ms (median of 5).",
            "",
        ]
    if "spec" in results:
        sp = results["spec"]
        lines += [
            "### Speculative decoding (single stream, temperature 0)",
            "",
            f"Baseline without speculation: {_f(sp['baseline']['decode_tok_s'], 1)} decode tok/s; "
            f"{sp['num_requests']} requests x {sp['max_tokens']} tokens per point.",
            "",
            "| draft | k | decode tok/s | speedup | acceptance rate | mean acceptance length | "
            "accepted per step | pays off |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sp["rows"]:
            lines.append(
                f"| {r['draft']} | {r['k']} | {_f(r['decode_tok_s'], 1)} | {_f(r['speedup'])} | "
                f"{_f(r['draft_acceptance_rate'], 3)} | {_f(r['mean_acceptance_length'])} | "
                f"{_f(r['accepted_per_step'])} | {'yes' if r['pays_off'] else 'no'} |"
            )
        lines.append("")
    if "roofline" in results:
        ro = results["roofline"]
        lines += [
            "### Roofline: single-stream decode bound",
            "",
            f"{ro['num_params'] / 1e6:,.1f} M parameters; {ro['weight_bytes_per_step'] / 1e6:,.2f} MB of weights "
            f"and {ro['kv_bytes_per_token'] / 1e3:,.1f} kB of KV cache per token read per step "
            f"(quantization {ro['quantization'] or 'none'}, context {ro['context_len']}).",
            "",
            "| GPU | bandwidth GB/s | bound tok/s | measured tok/s | fraction |",
            "|---|---|---|---|---|",
        ]
        for r in ro["rows"]:
            lines.append(
                f"| {r['gpu']} | {r['bandwidth_gbs']:,.0f} | {_f(r['bound_tok_s'], 0)} | "
                f"{_f(r.get('measured_tok_s'), 1)} | {_f(r.get('fraction_of_bound'), 3)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _plots(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "pod" in results or "overhead" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        if "overhead" in results:
            rows = results["overhead"]["rows"]
            xs = [r["concurrency"] for r in rows]
            ax.plot(xs, [r["handler"]["throughput_tok_s"] for r in rows], "o-", label="handler path")
            ax.plot(xs, [r["vllm_asyncllm"]["throughput_tok_s"] for r in rows], "s--", label="vLLM AsyncLLM")
        if "pod" in results:
            rows = results["pod"]["rows"]
            xs = [r["concurrency"] for r in rows]
            ax.plot(xs, [r["pod"]["throughput_tok_s"] for r in rows], "^-", label="pod server")
            ax.plot(xs, [r["vllm_server"]["throughput_tok_s"] for r in rows], "v--", label="vLLM OpenAI server")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tokens/s")
        ax.set_title("Throughput vs concurrency")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)
    if "spec" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results["spec"]["rows"]:
            if r["mean_acceptance_length"] is None or r["speedup"] is None:
                continue
            ax.scatter(r["mean_acceptance_length"], r["speedup"])
            ax.annotate(
                f"{r['draft'].removeprefix('tiny:')} k={r['k']}",
                (r["mean_acceptance_length"], r["speedup"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.axhline(1.0, color="grey", lw=1)
        ax.axvline(1.5, color="red", lw=1, ls=":", label="0.5 accepted tokens/step")
        ax.set_xlabel("mean acceptance length (tokens per verify step)")
        ax.set_ylabel("speedup vs no speculation")
        ax.set_title("Speculative decoding: speedup vs acceptance")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "speculative.png", dpi=120)
        plt.close(fig)


# ------------------------------------------------------------------------------ entry
@dataclass
class Plan:
    parts: list[str]
    label: str = ""
    concurrencies: list[int] = field(default_factory=lambda: [1, 4, 16])
    num_requests: int = 32
    max_tokens: int = 256
    repeats: int = 3
    drafts: list[str] = field(default_factory=lambda: ["tiny:target", "tiny:noisy", "tiny:unrelated", "ngram"])
    ks: list[int] = field(default_factory=lambda: [2, 4, 8])
    spec_requests: int = 4
    raw_input: str = "text"
    stats_off_baseline: bool = False


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(Exception):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run(plan: Plan, *, out: Path, env: dict[str, str], gpu: str | None, command: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    settings = load_settings(env)
    from worker.engine import Engine  # resolves tiny models and checks the vLLM install early

    model_path = Engine.build_args(settings).model
    results: dict[str, Any] = {"command": command, "machine": _machine(), "plan": asdict(plan), "label": plan.label}
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            results["gpu"] = torch.cuda.get_device_name(0)
    with contextlib.suppress(Exception):
        import vllm

        results["vllm_version"] = vllm.__version__
    if "overhead" in plan.parts:
        results["overhead"] = asyncio.run(
            bench_overhead(
                settings,
                concurrencies=plan.concurrencies,
                num_requests=plan.num_requests,
                max_tokens=plan.max_tokens,
                repeats=plan.repeats,
                raw_input=plan.raw_input,
                stats_off_baseline=plan.stats_off_baseline,
            )
        )
        write_report(results, out)
    if "pod" in plan.parts:
        results["pod"] = bench_pod(
            settings,
            env,
            model_path=model_path,
            out=out,
            concurrencies=plan.concurrencies,
            num_requests=plan.num_requests,
            max_tokens=plan.max_tokens,
            repeats=plan.repeats,
        )
        write_report(results, out)
    if "coldstart" in plan.parts:
        results["coldstart"] = bench_coldstart(settings, env, model_path=model_path, out=out)
        write_report(results, out)
    if "coldstart_handler" in plan.parts:
        results["coldstart_handler"] = bench_coldstart(settings, env, model_path=model_path, out=out, with_server=False)
        write_report(results, out)
    if "spec" in plan.parts:
        results["spec"] = bench_spec(
            env, drafts=plan.drafts, ks=plan.ks, num_requests=plan.spec_requests, max_tokens=plan.max_tokens
        )
        write_report(results, out)
    if "roofline" in plan.parts:
        measured = None
        if "overhead" in results and results["overhead"]["rows"][0]["concurrency"] == 1:
            itl = results["overhead"]["rows"][0]["handler"]["itl_mean_ms"]
            measured = 1000 / itl if itl else None
        elif "spec" in results:
            measured = results["spec"]["baseline"]["decode_tok_s"]
        results["roofline"] = bench_roofline(
            model_path,
            quantization=settings.quantization,
            dtype="bfloat16",
            context_len=plan.max_tokens,
            measured_tok_s=measured,
            gpu=gpu,
        )
    write_report(results, out)
    return results


ALL_PARTS = ["overhead", "pod", "coldstart", "coldstart_handler", "spec", "roofline"]

LLAMA3_SHAPES = ("llama-3-8b", "llama-3.2-1b", "llama-3-70b")


def llama3_config(shape: str = "llama-3-8b") -> dict[str, Any]:
    """A Llama-3 ``config.json`` for one of the planner's presets (all share one vocabulary)."""
    return {
        **PRESETS[shape],
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "tie_word_embeddings": shape == "llama-3.2-1b",
    }


def make_shape_model(path: Path, *, awq: bool = False, shape: str = "llama-3-8b") -> None:
    """A Llama-3-shaped checkpoint without weights (serve with LOAD_FORMAT=dummy) and a word-level
    tokenizer covering its whole vocabulary, so that text goes in and out as with a real model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    config = llama3_config(shape)
    if awq:
        config["quantization_config"] = {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "zero_point": True,
            "version": "gemm",
        }
    (path / "config.json").write_text(json.dumps(config, indent=1))
    words = PROMPT.lower().split()
    vocab = {word: i for i, word in enumerate(words)}
    vocab.update({f"w{i}": i for i in range(len(words), int(config["vocab_size"]))})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w10"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="w10", bos_token="w128000", eos_token="w128001"
    )
    fast.save_pretrained(path)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker bench", description="benchmark the worker against its peers"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--parts", default=",".join(ALL_PARTS), help=f"comma-separated subset of {ALL_PARTS}")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    parser.add_argument("--num-requests", type=int, default=32, help="per concurrency level; 0: two waves (auto)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--raw-input",
        choices=["text", "ids"],
        default="text",
        help="what the overhead part gives AsyncLLM: the text prompt (like the handler) or token ids made once",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--drafts", default="tiny:target,tiny:noisy,tiny:unrelated,ngram")
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--spec-requests", type=int, default=4)
    parser.add_argument("--gpu", choices=sorted(GPUS), help="the GPU this runs on, for the roofline fraction")
    parser.add_argument("--label", default="", help="a name for this configuration, kept in the results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness, not speed")
    parser.add_argument(
        "--make-llama8b",
        type=Path,
        metavar="DIR",
        help="write a Llama-3-8B-shaped checkpoint (no weights: serve with LOAD_FORMAT=dummy) to DIR and exit",
    )
    parser.add_argument("--awq", action="store_true", help="with --make-llama8b: an AWQ 4-bit checkpoint config")
    parser.add_argument(
        "--shape", choices=LLAMA3_SHAPES, default="llama-3-8b", help="with --make-llama8b: the model shape written"
    )
    parser.add_argument(
        "--stats-off-baseline",
        action="store_true",
        help="overhead part, speculating configs: also the handler over an engine without the exact-stats path",
    )
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="print Markdown for saved bench.json files and boot logs, and exit",
    )
    args = parser.parse_args(argv)
    if args.render:
        print(render_saved(args.render))
        return 0
    if args.make_llama8b:
        make_shape_model(args.make_llama8b, awq=args.awq, shape=args.shape)
        return 0
    plan = Plan(
        parts=[p for p in args.parts.split(",") if p],
        concurrencies=[int(c) for c in args.concurrency.split(",")],
        num_requests=args.num_requests,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        drafts=args.drafts.split(","),
        ks=[int(k) for k in args.ks.split(",")],
        spec_requests=args.spec_requests,
        label=args.label,
        raw_input=args.raw_input,
        stats_off_baseline=args.stats_off_baseline,
    )
    if args.smoke:
        plan = Plan(
            parts=plan.parts,
            concurrencies=[1, 2],
            num_requests=4,
            max_tokens=16,
            repeats=1,
            drafts=["tiny:noisy"],
            ks=[2],
            spec_requests=1,
            label=plan.label,
            stats_off_baseline=plan.stats_off_baseline,
        )
    unknown = set(plan.parts) - set(ALL_PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    # Overhead and the server comparison measure the serving path, so speculation is off there;
    # the spec part sets its own drafts.
    env = {**os.environ, "SPECULATIVE_METHOD": os.environ.get("SPECULATIVE_METHOD", "none")}
    env.setdefault("MAX_NUM_SEQS", str(max(plan.concurrencies)))
    command = "python -m worker bench " + " ".join(argv if argv is not None else sys.argv[1:])
    # A benchmark stopped with SIGTERM (e.g. by `timeout`) must still stop the servers it started
    # (each in its own session): turn the signal into an exit that runs their clean-up.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    results = run(plan, out=args.out, env=env, gpu=args.gpu, command=command.strip())
    print(render_markdown(results))
    return 0
