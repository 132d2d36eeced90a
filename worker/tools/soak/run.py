"""The soak's run: the two servers, the client loops, the samples and the summary."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.tools.bench.servers import alive_after, free_port, wait_until_ready
from worker.tools.soak.pod_traffic import PodTraffic
from worker.tools.soak.serverless_traffic import ServerlessTraffic
from worker.tools.soak.traffic import ADAPTER, Lost

__all__ = ["SoakResult", "growth", "parse_gauges", "run_soak", "server_env"]

ROOT = Path(__file__).resolve().parents[3]
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


@dataclass
class SoakResult:
    summary: dict[str, Any]
    samples: list[dict[str, Any]] = field(default_factory=list)


# The soak's traffic and adapter are the tiny models' (traffic.py): where no model is named, the tiny
# target with its noisy-copy draft, what an unset MODEL_NAME served before the default became SmolLM2.
TINY_DEFAULT = {"MODEL_NAME": "tiny:target", "SPECULATIVE_MODEL": "tiny:noisy", "NUM_SPECULATIVE_TOKENS": "3"}


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if "MODEL_NAME" not in env:
        env.update(TINY_DEFAULT)
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


# How long the engine's processes may take to exit once their server has (vLLM stops them with
# a bounded wait of its own; on a loaded 2-core machine that took over a second).
_CHILDREN_EXIT_S = 20.0


def _stop(servers: list[Server]) -> list[int]:
    """SIGTERM each server; return the pids of its processes still alive once the server has
    exited (within 60 s) and its children have had ``_CHILDREN_EXIT_S`` more."""
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
    left = alive_after(pids, _CHILDREN_EXIT_S)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def parse_gauges(text: str) -> dict[str, float]:
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
            sample["gauges"][server.role] = parse_gauges((await client.get(server.metrics_url, timeout=10)).text)
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
        now = {s.role: parse_gauges((await client.get(s.metrics_url, timeout=10)).text) for s in servers}
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

    # An idle connection expires on the client's side before uvicorn's 5-s keep-alive closes it:
    # with httpx's default (also 5 s) a request could leave on a connection the server was closing
    # and end in a ReadError that never reached the server (2 of 67,610 in the first hour's soak).
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=2.0)
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
        idle = {s.role: parse_gauges((await client.get(s.metrics_url, timeout=10)).text) for s in servers}
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


def growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, dict[str, Any]]:
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
    for name in ("SPECULATIVE_MODEL", "NUM_SPECULATIVE_TOKENS"):  # the handler serves without speculation
        handler_env.pop(name, None)
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
    figures = growth(samples, warmup_minutes * 60)
    goals = {
        "lost_0": by_outcome["lost"] == 0,
        "rss_growth_le_5pct": all(g["rss_growth_pct"] <= 5 for g in figures.values()),
        "fds_flat": all(g["fds"][1] <= g["fds"][0] + 2 for g in figures.values()),
        "threads_flat": all(g["threads"][1] <= g["threads"][0] + 2 for g in figures.values()),
        "idle_at_end": bool(end["idle_at_end"]),
        "no_process_left": not left,
    }
    summary = {
        "command": f"python -m worker soak --minutes {minutes:g} --warmup-minutes {warmup_minutes:g} "
        f"--sample-every {sample_every_s:g} --clients {clients} --seed {seed}",
        "minutes": minutes,
        "warmup_minutes": warmup_minutes,
        "clients_per_server": clients,
        "requests": requests,
        "outcomes": dict(by_outcome),
        "by_scenario": dict(sorted(counts.items())),
        "lost": lost[:50],
        "growth": figures,
        "processes_left": left,
        **end,
        "goals": goals,
        "met": all(goals.values()),
    }
    result = SoakResult(summary, samples)
    (out_dir / "soak.json").write_text(json.dumps({"summary": summary, "samples": samples}, indent=1) + "\n")
    return result
