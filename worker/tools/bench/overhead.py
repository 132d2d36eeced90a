"""The handler's code path against raw ``AsyncLLM`` on one engine (and, for a speculating
config, against an identical engine without the exact-stats path)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from worker.config import Settings
from worker.speculation.stats.tracking import Release, RequestEnd
from worker.tools.bench.engines import EnginePool
from worker.tools.bench.spec import engine_spec_counters, spec_counters_since
from worker.tools.bench.timing import PROMPT, RequestTiming, median, ratio, requests_for, run_concurrent, summarize

if TYPE_CHECKING:
    from worker.engine import Engine
    from worker.serverless import ServerlessWorker


async def bench_overhead(
    settings: Settings,
    *,
    concurrencies: list[int],
    num_requests: int,
    max_tokens: int,
    repeats: int,
    raw_input: str = "text",
    stats_off_baseline: bool = False,
    aa_baseline: bool = False,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    pool: EnginePool | None = None,
) -> dict[str, Any]:
    """Handler vs raw AsyncLLM on one engine; with ``stats_off_baseline`` (a speculating config)
    also the handler over a second engine, identical but for the worker's exact-stats path
    (``PER_REQUEST_SPEC_DECODE_METRICS=none``: vLLM's plain scheduler), both engines booted side
    by side (half the GPU memory each) so that the paths can alternate within each repeat. With
    ``aa_baseline``, a second engine identical in every way (an A/A control): the spread between
    two equal engines side by side, against which the stats-off difference can be judged.

    ``on_progress`` gets the result so far after each concurrency level and once more before the
    engines shut down (marked ``"partial": True`` until then): a run cut short by a time limit,
    even during the shutdown of several engines, keeps what it measured."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from worker.schema import parse_request

    pool = pool or EnginePool(share=False)
    stats_off_baseline = stats_off_baseline and settings.resolved_speculative_config is not None
    num_engines = 1 + stats_off_baseline + aa_baseline
    if num_engines > 1:
        share = settings.gpu_memory_utilization / num_engines
        settings = settings.model_copy(update={"gpu_memory_utilization": share})
    # The measured engine boots last: each AsyncLLM's Prometheus logger unregisters vLLM's metrics
    # of the engines before it, and the exactness check below reads that engine's counters.
    engines: dict[str, Engine] = {}
    if stats_off_baseline:
        engines["handler_stats_off"] = await pool.get(
            settings.model_copy(update={"per_request_spec_decode_metrics": "none"})
        )
    if aa_baseline:  # a twin of its own (a shared pool would hand out the measured engine)
        engines["handler_aa"] = await pool.boot(settings)
    engine = await pool.get(settings)
    engines = {"handler": engine, **engines}
    served = engine.served.model_dump()
    # Both paths share the engine, hence its stream interval (tokens per engine output).
    stream_interval = engine.llm.vllm_config.scheduler_config.stream_interval
    job = {"prompt": PROMPT, "sampling_params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}

    def handler_path(over: Engine) -> Callable[[int], Callable[[RequestTiming], Any]]:
        worker = _worker_over(over, settings)
        return lambda i: handler_request(worker, i)

    def handler_request(worker: ServerlessWorker, i: int) -> Callable[[RequestTiming], Any]:
        async def run(timing: RequestTiming) -> None:
            items: AsyncIterator[Any] = worker.handle({"id": f"h{i}", "input": job})  # native: JSON objects
            async for item in items:
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
    for name, second in engines.items():
        if name != "handler":
            paths[name] = handler_path(second)
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "num_requests": num_requests or "auto",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "baseline_input": raw_input,
        "stream_interval": stream_interval,
        "stats_off_baseline": stats_off_baseline,
        "aa_baseline": aa_baseline,
        "served": served,
        "spec_exact": None,
        "rows": results,
        "partial": True,
    }
    try:
        for path in paths.values():  # warm-up: compile, prefix cache
            await run_concurrent(path, num_requests=2, concurrency=2)
        for concurrency in concurrencies:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
            for rep in range(repeats):
                order = list(paths) if rep % 2 == 0 else list(reversed(paths))
                for name in order:
                    timings, wall = await run_concurrent(
                        paths[name], num_requests=requests_for(concurrency, num_requests), concurrency=concurrency
                    )
                    runs[name].append(summarize(timings, wall))
            row: dict[str, Any] = {"concurrency": concurrency}
            for name, summaries in runs.items():
                row[name] = {key: median([s[key] for s in summaries]) for key in summaries[0]}
            ours, theirs = row["handler"], row["vllm_asyncllm"]
            row["throughput_ratio"] = ratio(ours["throughput_tok_s"], theirs["throughput_tok_s"])
            row["ttft_p50_ratio"] = ratio(ours["ttft_p50_ms"], theirs["ttft_p50_ms"])
            row["itl_mean_ratio"] = ratio(ours["itl_mean_ms"], theirs["itl_mean_ms"])
            if stats_off_baseline:
                off = row["handler_stats_off"]
                row["stats_throughput_ratio"] = ratio(ours["throughput_tok_s"], off["throughput_tok_s"])
                row["stats_itl_ratio"] = ratio(ours["itl_mean_ms"], off["itl_mean_ms"])
            if aa_baseline:
                twin = row["handler_aa"]
                row["aa_throughput_ratio"] = ratio(ours["throughput_tok_s"], twin["throughput_tok_s"])
                row["aa_itl_ratio"] = ratio(ours["itl_mean_ms"], twin["itl_mean_ms"])
            results.append(row)
            print(f"overhead c={concurrency}: throughput ratio {row['throughput_ratio']:.3f}", flush=True)
            if on_progress:
                on_progress(report)
        if settings.resolved_speculative_config:
            report["spec_exact"] = await _spec_exactness(engine, settings, job, stop_requests=max(concurrencies))
        report["partial"] = False
        if on_progress:
            on_progress(report)
    finally:
        for booted in engines.values():
            pool.release(booted)
    return report


async def _spec_exactness(
    engine: Engine, settings: Settings, job: dict[str, Any], *, requests: int = 16, stop_requests: int = 16
) -> dict[str, Any]:
    """Concurrent handler jobs on a speculating engine: their per-request ``spec_decode`` summed,
    against vLLM's engine-wide counters over the same interval (nothing else runs on the engine).

    Then ``stop_requests`` such jobs (the run's highest concurrency: the frontend at its busiest),
    each with a stop string cut from the first job's text at its own place (so they end at
    different steps, some before ``max_tokens``): vLLM's counters also count the
    steps the engine core ran past each stop string before its abort landed, which the frontend
    took off (``spec_frontend``), so there the per-request sums plus what was taken off must equal
    them."""
    report, texts = await _summed_against_counters(engine, settings, [job] * requests, label="exact")
    text = texts[0]
    places = (len(text) * (i + 1) // (stop_requests + 1) for i in range(stop_requests))
    stops = [text[p : p + 4] or "\n\n" for p in places]
    jobs = [{**job, "sampling_params": {**job["sampling_params"], "stop": [stop]}} for stop in stops]
    with _releases(engine) as releases:
        stopped, _ = await _summed_against_counters(engine, settings, jobs, label="stop", releases=releases)
    waits = sorted(r.held_s * 1000 for r in releases)
    stopped["released"] = {outcome: sum(r.outcome == outcome for r in releases) for outcome in ("exact", "partial")}
    stopped["outputs_taken_off"] = dict(
        collections.Counter(str(r.num_outputs_taken_off if r.is_exact else -1) for r in releases)
    )
    stopped["held_ms"] = {"median": statistics.median(waits), "max": waits[-1]} if waits else None
    stopped["stops"] = sorted(set(stops))[:32]
    report["with_stop"] = stopped
    return report


@contextlib.contextmanager
def _releases(engine: Engine) -> Iterator[list[Release]]:
    """How the frontend released each stop string's final output while the block runs (the
    records its requests' ends carry)."""
    found: list[Release] = []

    def observe(end: RequestEnd) -> None:
        if end.release is not None:
            found.append(end.release)

    engine.observers.append(observe)
    try:
        yield found
    finally:
        engine.observers.remove(observe)


async def _summed_against_counters(
    engine: Engine,
    settings: Settings,
    jobs: list[dict[str, Any]],
    *,
    label: str,
    releases: list[Release] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The jobs run concurrently through the handler: their stats summed (plus what the frontend
    took off past stop strings) against vLLM's counters, and each job's text."""
    worker = _worker_over(engine, settings)
    before = engine_spec_counters()

    async def one(i: int, job: dict[str, Any]) -> tuple[dict[str, Any], str]:
        items: AsyncIterator[Any] = worker.handle({"id": f"{label}{i}", "input": job})  # native: JSON objects
        chunks = [item async for item in items]
        last = chunks[-1]
        final = dict(last.get("spec_decode") or {}) | {"finish_reason": last.get("finish_reason")}
        return final, "".join(str(chunk.get("text") or "") for chunk in chunks)

    done = await asyncio.gather(*(one(i, job) for i, job in enumerate(jobs)))
    finals = [final for final, _ in done]
    summed = {
        "num_drafts": sum(f.get("num_spec_steps", 0) for f in finals),
        "num_draft_tokens": sum(f.get("num_draft_tokens", 0) for f in finals),
        "num_accepted_tokens": sum(f.get("num_accepted_draft_tokens", 0) for f in finals),
    }
    # vLLM's counters also count the steps the core ran past each stop string, which the frontend took off.
    taken = [r.taken_off for r in releases or []]
    taken_off = {key: sum(t[i] for t in taken) for i, key in enumerate(summed)}
    expected = {key: summed[key] + taken_off[key] for key in summed}
    counters = await spec_counters_since(before, num_draft_tokens=expected["num_draft_tokens"])
    report = {
        "requests": len(jobs),
        "with_spec_decode": sum(1 for f in finals if "num_spec_steps" in f),
        "partial": sum(1 for f in finals if f.get("partial")),
        "finish_reasons": dict(collections.Counter(str(f["finish_reason"]) for f in finals)),
        "per_request_sum": summed,
        "taken_off": taken_off,
        "engine_counters": counters,
        "equal": expected == counters,
    }
    return report, [text for _, text in done]


def _worker_over(engine: Engine, settings: Settings) -> ServerlessWorker:
    """The serverless handler's worker over an engine already booted (shared by several paths)."""
    from worker.runtime import EngineHolder
    from worker.serverless import ServerlessWorker

    async def factory(_: Settings) -> Engine:
        return engine

    return ServerlessWorker(EngineHolder(settings_loader=lambda: settings, engine_factory=factory))
