"""Faults on a multi-GPU engine (tensor parallelism): the checks of tests/test_reliability.py,
run against whatever model the environment configures (MODEL_NAME, TENSOR_PARALLEL_SIZE, ...),
without pytest, on a GPU machine.

    TENSOR_PARALLEL_SIZE=2 MODEL_NAME=/tmp/llama8b LOAD_FORMAT=dummy python scripts/gpu_faults.py OUT.json

1. pod: one streamed completion to its end, its ``metrics.speculative_decoding`` against vLLM's
   spec-decode counters on ``/metrics`` over the same request (with speculation on); then SIGTERM
   with a stream in flight: the stream completes, the server exits, and no process it started
   (engine core, one worker per GPU) is alive 30 s later;
2. pod, one tensor-parallel worker killed mid-stream: the stream ends with an error, /health turns
   503, the server exits 1, nothing left running;
3. serverless (the handler's ServerlessWorker in this process), one worker killed while three jobs
   stream: each ends with error_type engine_dead, the worker asks RunPod for a replacement
   (refresh_worker), a later job gets engine_dead at once, nothing left running.

The GPU workers are told apart from the engine core by nvidia-smi (they hold the GPUs), since
process titles need setproctitle, which a trimmed install may lack.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import alive_after, cmdline, descendants, free_port, job_items, kill_while_jobs_stream  # noqa: E402

BODY = {"prompt": "The", "max_tokens": 400, "ignore_eos": True, "stream": True}


def gpu_workers(among: list[int]) -> list[int]:
    """The processes among ``among`` that hold a GPU; without nvidia-smi (a CPU dry run), the engine core."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout
    except FileNotFoundError:
        return [pid for pid in among if "EngineCore" in cmdline(pid)]
    holding = {int(x) for x in out.split()}
    return sorted(pid for pid in among if pid in holding)


def start_pod(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "serve", "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 560
    while time.time() < deadline:
        try:
            if httpx.get(base + "/health", timeout=5).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"pod exited during boot: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    raise RuntimeError("pod not ready")


def spec_counters(base: str) -> dict[str, float]:
    """vLLM's engine-wide spec-decode counters from the pod's /metrics (summed over label sets)."""
    names = {
        "vllm:spec_decode_num_drafts_total": "num_drafts",
        "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
    }
    found = dict.fromkeys(names.values(), 0.0)
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            found[names[name]] += float(line.rsplit(" ", 1)[1])
    return found


def pod_stream_stats(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed completion with usage: its per-request spec-decode counts against the engine's."""
    before = spec_counters(base)
    usage_event: dict[str, Any] = {}
    with httpx.stream(
        "POST", base + "/v1/completions", json={**body, "stream_options": {"include_usage": True}}, timeout=300
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage_event = event
    time.sleep(1)  # the engine's counters reach the frontend with its next stats update
    after = spec_counters(base)
    engine = {key: after[key] - before[key] for key in after}
    spec = (usage_event.get("metrics") or {}).get("speculative_decoding") or {}
    return {
        "completion_tokens": (usage_event.get("usage") or {}).get("completion_tokens"),
        "response_spec_decode": spec,
        "engine_counters": engine,
        "exact": bool(spec)
        and spec.get("num_draft_tokens") == engine["num_draft_tokens"]
        and spec.get("num_accepted_draft_tokens") == engine["num_accepted_tokens"]
        and spec.get("num_spec_steps") == engine["num_drafts"],
    }


def pod_sigterm(tmp: Path) -> dict[str, Any]:
    proc, base = start_pod(tmp / "pod-sigterm.log")
    body = {**BODY, "model": os.environ.get("SERVED_MODEL_NAME") or os.environ["MODEL_NAME"]}
    stats = pod_stream_stats(base, body) if os.environ.get("SPECULATIVE_METHOD", "none") != "none" else None
    started = time.perf_counter()
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        first = next(lines)
        processes = descendants(proc.pid)
        workers = gpu_workers(processes)
        proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line]
    left = alive_after(processes, 30)
    code = proc.wait(timeout=60)
    return {
        "spec_decode_check": stats,
        "first_line_ok": first.startswith("data: "),
        "stream_completed": bool(rest) and rest[-1] == "data: [DONE]" and not any('"error"' in x for x in rest),
        "processes_before": len(processes),
        "gpu_workers": len(workers),
        "exit_code": code,
        "alive_30s_after": [cmdline(pid)[:80] for pid in left],
        "seconds": round(time.perf_counter() - started, 2),
    }


def pod_worker_death(tmp: Path) -> dict[str, Any]:
    proc, base = start_pod(tmp / "pod-death.log")
    body = {**BODY, "model": os.environ.get("SERVED_MODEL_NAME") or os.environ["MODEL_NAME"]}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as response:
        lines = response.iter_lines()
        next(lines)
        processes = descendants(proc.pid)
        victim = gpu_workers(processes)[-1]
        killed_at = time.perf_counter()
        os.kill(victim, signal.SIGKILL)
        try:
            rest = list(lines)
        except httpx.HTTPError:
            rest = ["(connection closed)"]
    ended_after = time.perf_counter() - killed_at
    statuses = []
    while proc.poll() is None and time.perf_counter() - killed_at < 60:
        try:
            statuses.append(httpx.get(base + "/health", timeout=2).status_code)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    code = proc.wait(timeout=60)
    return {
        "stream_ended_with_error": any('"error"' in line for line in rest) or rest == ["(connection closed)"],
        "stream_ended_s_after_kill": round(ended_after, 2),
        "health_503_seen": 503 in statuses,
        "exit_code": code,
        "alive_30s_after": [cmdline(pid)[:80] for pid in alive_after(processes, 30)],
    }


async def serverless_worker_death() -> dict[str, Any]:
    from worker.runtime import EngineHolder
    from worker.serverless import ServerlessWorker

    worker = ServerlessWorker(EngineHolder())
    job = {"prompt": "The", "sampling_params": {"max_tokens": 400, "ignore_eos": True}}
    processes: list[int] = []

    def kill_one_gpu_worker() -> None:
        # multiprocessing's resource tracker lives as long as this process does: not the engine's.
        processes.extend(pid for pid in descendants(os.getpid()) if "resource_tracker" not in cmdline(pid))
        os.kill(gpu_workers(processes)[-1], signal.SIGKILL)

    results, ended_after = await kill_while_jobs_stream(worker, job, kill_one_gpu_worker, timeout_s=560)
    later = await job_items(worker, {"id": "after", "input": job})
    return {
        "in_flight_error_types": [items[-1].get("error_type") for items in results],
        "ended_s_after_kill": round(ended_after, 2),
        "refresh_worker": worker.runpod_config.get("refresh_worker") is True,
        "later_job_error_type": later[-1].get("error_type"),
        "alive_30s_after": [cmdline(pid)[:80] for pid in alive_after(processes, 30)],
    }


def main() -> int:
    out = Path(sys.argv[1])
    tmp = out.parent
    results: dict[str, Any] = {
        "env": {k: v for k, v in os.environ.items() if k in ("MODEL_NAME", "TENSOR_PARALLEL_SIZE", "ENFORCE_EAGER")}
    }
    checks: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("pod_sigterm", lambda: pod_sigterm(tmp)),
        ("pod_worker_death", lambda: pod_worker_death(tmp)),
    ]
    checks.append(("serverless_worker_death", lambda: asyncio.run(serverless_worker_death())))
    for name, check in checks:
        try:
            results[name] = check()
        except Exception as exc:  # a failed check is a result to report, and the next still runs
            results[name] = {"failed": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps(results[name]), flush=True)
        out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
