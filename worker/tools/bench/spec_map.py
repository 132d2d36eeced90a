"""Where speculation pays: decode throughput and ITL per speculation configuration and load.

Every configuration is an engine of its own, all booted side by side (an equal share of the GPU's
memory each), so that the runs alternate between them: for each repeat, for each concurrency, each
engine in turn (the order rotated per repeat) decodes one wave of ``concurrency`` requests of
``max_tokens`` tokens. The figures are medians over the repeats.

A configuration is ``none`` or ``DRAFTER:K:LENGTH:CONTROL``:

- ``DRAFTER``: ``ngram``, ``ngram_gpu`` or a draft model (a path or ``tiny:`` name; an EAGLE-3 head's path runs as
  vLLM's ``eagle3``);
- ``K``: ``NUM_SPECULATIVE_TOKENS``;
- ``LENGTH``: the mean acceptance length vLLM's synthetic rejection sampler holds the drafts to
  (``rejection_sample_method="synthetic"``: the draft and the target run for real, acceptance
  follows the set rate; GPU only), or ``real`` for the standard sampler;
- ``CONTROL``: ``static`` or ``auto`` (``SPECULATION_CONTROL``), or ``stock``: static, with the
  worker's exact-stats path off (``PER_REQUEST_SPEC_DECODE_METRICS=none``), so vLLM's own scheduler
  and output processor run: the peer for the worker's cost.

A configuration may end in ``+KEY=VALUE`` pairs, more worker settings for that engine alone
(``none+TORCH_COMPILE=on``).

Synthetic acceptance because no real draft weights can be had here: with dummy weights the cost of
speculation is real and the acceptance is chosen. vLLM's synthetic rates are per position, for
every request alike. ``SPEC_MAP_ACCEPTANCE_MIX`` (``1.0,0.6,0.0``) in the environment mixes
acceptance levels within each wave, request ``i`` in class ``i % n`` (:mod:`.acceptance_mix`: V2
engines, with the synthetic LENGTH at ``K + 1``); each point then reports the acceptance length
per class. A mixed wave is a steady state, not one request per stream: the classes finish at
different steps (at rates 1.0 and 0.0 and K = 4, 5x apart), so a single wave's time is the slowest
class's, decoded at a shrinking batch. Each stream therefore runs ``MIX_REQUESTS_PER_STREAM``
requests back to back, and the throughput is the tokens streamed while every stream is busy, after
the wave's first requests have all ended (:func:`steady_window`): by then the controller's evidence
from the wave before (which ends with the slowest class alone) has aged by the slowest class's
lifetime. Its engine step is not reported (the batch's requests no longer decode in lockstep), and
its ITL and TTFT are every request's.

With a mix, ``--length-spread S`` gives request ``i`` its own length, ``max_tokens`` times ``1 + S * u`` with
``u`` in [-1, 1) drawn from ``i`` (the same in every configuration; the mean stays ``max_tokens``).
With one length for all, requests without speculation end, and are replaced, together, where
speculation's uneven acceptance spreads their ends; on a GPU a step that a request joins held
the host for two or three decode steps (docs/benchmarks.md), so the spread gives every
configuration the staggered turnover real traffic has.

    python -m worker.tools.bench.spec_map --out DIR --configs none,/tmp/d:4:2.5:static,... \\
        --concurrency 1,8,64,256 --max-tokens 128 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from worker.config import load_settings
from worker.tools.bench.acceptance_mix import MIX_ENV, install, mix_request_id, parse_mix
from worker.tools.bench.spec_map_config import check_mix, config_env
from worker.tools.bench.spec_map_report import fill_vs_none, render, render_pooled
from worker.tools.bench.step_trace import TRACE_ENV
from worker.tools.bench.step_trace import install as install_step_trace
from worker.tools.bench.timing import PROMPT, RequestTiming, median, run_concurrent, summarize

__all__ = [
    "MIX_REQUESTS_PER_STREAM",
    "bench_spec_map",
    "controller_step_us",
    "main",
    "median_point",
    "run_wave",
    "steady_window",
]


# Requests per stream in a mixed wave: at the map's classes (1.0, 0.6 and 0.0 at K = 4) the window
# then spans about two lifetimes of the slowest class's request.
MIX_REQUESTS_PER_STREAM = 6


def steady_window(timings: list[RequestTiming], *, concurrency: int) -> tuple[float, float] | None:
    """The part of a closed-loop run of ``concurrency`` streams where every stream is busy with its
    later requests: from the end of the last of the first ``concurrency`` requests (the ones that
    started together, with their prefills) to the first end after the last request's start (the
    batch can no longer be refilled). None where that is empty."""
    first = sorted(timings, key=lambda t: t.start)[:concurrency]
    if not first or any(t.end is None for t in first):
        return None
    start = max(t.end for t in first if t.end is not None)
    last_start = max(t.start for t in timings)
    end = min((t.end for t in timings if t.end is not None and t.end > last_start), default=None)
    return (start, end) if end is not None and end > start else None


def request_tokens(index: int, max_tokens: int, spread: float) -> int:
    """Request ``index``'s length under ``--length-spread`` (module docstring)."""
    if not spread:
        return max_tokens
    return max(1, round(max_tokens * (1 + spread * random.Random(index).uniform(-1.0, 1.0))))


async def run_wave(
    engine: Any, *, concurrency: int, max_tokens: int, mix: list[float] | None = None, spread: float = 0.0
) -> dict[str, Any]:
    """``concurrency`` requests at once through the worker's engine path; throughput, ITL, and the
    per-request spec-decode counts summed (steps with speculation off: the request's tokens after
    the first that no verify step yielded). ``mix``: the classes' rates (:mod:`.acceptance_mix`);
    the acceptance length of each class is reported too."""
    from worker.schema import parse_request

    sums = {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0, "num_steps_off": 0}
    by_class = [[0, 0] for _ in mix or ()]  # (verify steps, accepted drafts) per class
    streamed: list[tuple[float, int]] = []  # (time, tokens) of each chunk: a mixed wave's window

    def make(i: int) -> Any:
        request = parse_request(
            {
                "prompt": f"{PROMPT} {i}",
                "sampling_params": {
                    "max_tokens": request_tokens(i, max_tokens, spread),
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        )

        async def run(timing: RequestTiming) -> None:
            rid = mix_request_id(i, len(mix)) if mix else None
            async for chunk in engine.generate(request, request_id=rid):
                if chunk.num_tokens:
                    now = time.perf_counter()
                    timing.first_token = timing.first_token or now
                    if mix:
                        streamed.append((now, chunk.num_tokens))
                if chunk.is_final:
                    assert chunk.usage is not None
                    timing.num_tokens = chunk.usage.completion_tokens
                    stats = chunk.spec_decode
                    if stats is not None:
                        sums["num_spec_steps"] += stats.num_spec_steps
                        sums["num_draft_tokens"] += stats.num_draft_tokens
                        sums["num_accepted_draft_tokens"] += stats.num_accepted_draft_tokens
                        if mix:
                            counts = by_class[i % len(mix)]
                            counts[0] += stats.num_spec_steps
                            counts[1] += stats.num_accepted_draft_tokens
                        yielded = stats.num_spec_steps + stats.num_accepted_draft_tokens
                        sums["num_steps_off"] += max(0, timing.num_tokens - 1 - yielded)
            timing.end = time.perf_counter()

        return run

    per_stream = MIX_REQUESTS_PER_STREAM if mix else 1
    timings, wall = await run_concurrent(make, num_requests=concurrency * per_stream, concurrency=concurrency)
    point = summarize(timings, wall)
    if mix:
        window = steady_window(timings, concurrency=concurrency)
        point["steady_window_s"] = None if window is None else window[1] - window[0]
        point["throughput_tok_s"] = None  # no steady state to measure: not the whole wave's instead
        if window is not None:
            start, end = window
            point["throughput_tok_s"] = sum(n for at, n in streamed if start < at <= end) / (end - start)
    point.update(sums)
    steps = sums["num_spec_steps"]
    point["mean_acceptance_length"] = 1 + sums["num_accepted_draft_tokens"] / steps if steps else None
    point["mean_k_verified"] = sums["num_draft_tokens"] / steps if steps else None
    if mix:
        point["acceptance_by_class"] = [1 + accepted / n if n else None for n, accepted in by_class]
    # Engine steps in the wave, the streams decoding in lockstep: each request's decode steps (a
    # verify step, or one without drafts; without speculation one per token after the first).
    request_steps = steps + sums["num_steps_off"] if steps or sums["num_steps_off"] else point["tokens"] - len(timings)
    if engine.served.speculative_method is not None and not steps:
        request_steps = 0  # speculating without the per-request stats (``stock``): its steps are unknown
    point["ms_per_step"] = wall * 1000 * concurrency / request_steps if request_steps > 0 and not mix else None
    return point


def median_point(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = (
        "throughput_tok_s",
        "itl_p50_ms",
        "ms_per_step",
        "mean_acceptance_length",
        "mean_k_verified",
        "num_steps_off",
    )
    out: dict[str, Any] = {"runs": len(runs)}
    for key in keys:
        out[key] = median([r.get(key) for r in runs])
    classes = [r["acceptance_by_class"] for r in runs if r.get("acceptance_by_class")]
    if classes:
        out["acceptance_by_class"] = [median(list(values)) for values in zip(*classes, strict=True)]
    return out


async def bench_spec_map(
    base_env: dict[str, str],
    *,
    configs: list[str],
    concurrencies: list[int],
    max_tokens: int,
    repeats: int,
    out: Path,
    deadline_s: float | None = None,
    mix: list[float] | None = None,
    spread: float = 0.0,
) -> dict[str, Any]:
    """The map (module docstring); ``spec_map.json`` under ``out`` after every point, so that a run
    cut short keeps what it measured. ``deadline_s``: no new repeat starts after this many seconds.
    ``mix``: acceptance classes within each wave (:mod:`.acceptance_mix`); ``spread``: requests'
    own lengths (``--length-spread``)."""
    from worker.runtime import boot_engine

    if mix:
        check_mix(base_env, configs)
        install(mix)  # before the boots: the engine cores fork from this process
    if trace := os.environ.get(TRACE_ENV):
        install_step_trace(trace)  # the same way

    started = time.monotonic()
    share = float(base_env.get("GPU_MEMORY_UTILIZATION", "0.9")) / len(configs)
    result: dict[str, Any] = {
        "configs": configs,
        "concurrencies": concurrencies,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "mix": mix,
        "length_spread": spread,
        "boot_s": {},
        "errors": {},
        "runs": {name: {str(c): [] for c in concurrencies} for name in configs},
    }
    path = out / "spec_map.json"
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["table"] = {
            name: {c: median_point(runs) for c, runs in by_c.items() if runs} for name, by_c in result["runs"].items()
        }
        fill_vs_none(result["table"], configs)
        result["elapsed_s"] = round(time.monotonic() - started, 1)
        path.write_text(json.dumps(result, indent=1))

    engines: dict[str, Any] = {}
    try:
        for name in configs:  # one after the other: two booting at once can miss memory for the cache
            env = {**config_env(base_env, name), "GPU_MEMORY_UTILIZATION": f"{share:.3f}"}
            t0 = time.monotonic()
            try:
                engines[name] = await boot_engine(load_settings(env), mode="serverless")
            except Exception as exc:
                result["errors"][name] = f"boot: {exc}"
            result["boot_s"][name] = round(time.monotonic() - t0, 1)
            print(f"spec_map boot {name}: {result['boot_s'][name]} s", flush=True)
            save()
        for engine in engines.values():  # compile and capture nothing during the measured waves
            await run_wave(engine, concurrency=2, max_tokens=8)
        for repeat in range(repeats):
            if deadline_s is not None and repeat and time.monotonic() - started > deadline_s:
                result["stopped_early"] = f"after {repeat} repeats (deadline {deadline_s} s)"
                break
            for c in concurrencies:
                names = list(engines)
                names = names[repeat % len(names) :] + names[: repeat % len(names)]
                for name in names:
                    try:
                        point = await run_wave(
                            engines[name], concurrency=c, max_tokens=max_tokens, mix=mix, spread=spread
                        )
                    except Exception as exc:
                        result["errors"][name] = f"c={c}: {exc}"
                        engines.pop(name).shutdown()
                        continue
                    result["runs"][name][str(c)].append(point)
                    print(
                        f"spec_map r{repeat} c={c} {name}: {point['throughput_tok_s'] or 0:.0f} tok/s, "
                        f"ITL {point['itl_p50_ms'] or 0:.2f} ms, AL {point['mean_acceptance_length'] or 0:.2f}, "
                        f"k {point['mean_k_verified'] or 0:.2f}, off {point['num_steps_off']}",
                        flush=True,
                    )
                    save()
    finally:
        save()
        for engine in engines.values():
            engine.shutdown()
    return result


def controller_step_us(batch_size: int, *, k: int = 4, steps: int = 4000, caps: bool = True) -> float:
    """CPU time per engine step of ``SPECULATION_CONTROL=auto``'s hooks (the controller's lookup,
    its reading of the step's outputs, the per-request review every ``REVIEW_EVERY_STEPS`` steps
    and, with ``caps``, trimming half the requests' drafts), in microseconds: the worker's hooks
    over the shared stand-in of vLLM's scheduler (:class:`worker.vllm_internals.stand_in.ControlledStandIn`),
    less the stand-in's own update (its ``entered`` / ``returned`` marks)."""
    import random

    from worker.vllm_internals.stand_in import ControlledStandIn, add_drafting, step_inputs

    rng = random.Random(0)
    scheduler = ControlledStandIn(num_spec_tokens=k, max_batch_size=batch_size)
    ids = [f"req-{i}" for i in range(batch_size)]
    add_drafting(scheduler, dict.fromkeys(ids, k), num_spec_tokens=k)

    def inputs() -> Any:
        return step_inputs(
            num_scheduled_tokens={rid: 1 + k for rid in ids},
            drafts={rid: [-1] * k for rid in ids},
            invalid_drafts=None,
            sampled={rid: [0] * (1 + rng.randrange(k + 1)) for rid in ids},
        )

    for _ in range(50):  # each request's metrics: a histogram for the review to read
        scheduler.update_from_output(*inputs())
    if caps:  # a stand-in review: half the requests capped (trimmed before every step)
        half = {rid: 1 for rid in ids[::2]}
        scheduler.controller.review = lambda requests, *, batch_size: setattr(  # type: ignore[method-assign]
            scheduler.controller, "caps", half
        )
    steps_inputs = [inputs() for _ in range(16)]
    lookup = scheduler.dynamic_sd_lookup
    assert lookup is not None
    clock = time.perf_counter_ns
    elapsed = 0
    for step in range(steps):
        started = clock()
        scheduler.schedule()
        lookup[batch_size]
        scheduler.update_from_output(*steps_inputs[step % 16])
        elapsed += clock() - started - (scheduler.returned - scheduler.entered)
        for request in scheduler.running:  # vLLM puts the next drafts back (not the hooks' cost)
            request.spec_token_ids = [-1] * k
    return elapsed / steps / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.tools.bench.spec_map", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument(
        "--configs", default="", help="comma-separated (or ;-separated): none, DRAFTER:K:LENGTH:CONTROL[+KEY=VALUE...]"
    )
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        help="print Markdown for a saved spec_map.json (and plot it, beside it unless --plot) and exit; several: "
        "one table of each configuration against its own run's no speculation (plotted where --plot says)",
    )
    parser.add_argument("--plot", type=Path, help="where --render's plot goes (several maps: no plot without it)")
    parser.add_argument(
        "--controller-cost", action="store_true", help="print the auto controller's CPU time per step and exit"
    )
    parser.add_argument("--concurrency", default="1,8,32,64,128,256")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--deadline-s", type=float, default=None, help="start no repeat after this many seconds")
    parser.add_argument("--length-spread", type=float, default=0.0, help="requests' own lengths, 0 to 0.9 (docstring)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.length_spread <= 0.9:
        parser.error(f"--length-spread {args.length_spread}: give a fraction from 0 to 0.9")
    if args.length_spread and not os.environ.get(MIX_ENV):
        parser.error(f"--length-spread needs {MIX_ENV}: its throughput is a mixed wave's steady window")
    if args.render and len(args.render) == 1:
        print(render(json.loads(args.render[0].read_text()), plot=args.plot or args.render[0].with_suffix(".png")))
        return 0
    if args.render:
        labels = [path.resolve().parent.name for path in args.render]  # a run's folder names its map
        if len(set(labels)) < len(labels):
            labels = [str(path) for path in args.render]
        maps = [(label, json.loads(path.read_text())) for label, path in zip(labels, args.render, strict=True)]
        try:
            print(render_pooled(maps, plot=args.plot))
        except ValueError as exc:
            parser.error(str(exc))
        return 0
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.controller_cost:
        for batch_size in concurrencies:
            plain = statistics.median(controller_step_us(batch_size, caps=False) for _ in range(5))
            capped = statistics.median(controller_step_us(batch_size, caps=True) for _ in range(5))
            print(
                f"controller per step at batch {batch_size}: {plain:.1f} us, "
                f"{capped:.1f} us with half the requests capped"
            )
        return 0
    env = dict(os.environ)
    env.setdefault("MAX_NUM_SEQS", str(max(concurrencies)))
    # ";" separates configurations whose settings hold commas (+SPECULATIVE_TOKENS_BY_BATCH=1-1:4,2-2:2)
    configs = [name for name in args.configs.split(";" if ";" in args.configs else ",") if name]
    try:
        mix = parse_mix(env[MIX_ENV]) if env.get(MIX_ENV) else None
        if mix:
            check_mix(env, configs)
    except ValueError as exc:
        parser.error(str(exc))
    result = asyncio.run(
        bench_spec_map(
            env,
            configs=configs,
            concurrencies=concurrencies,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            out=args.out,
            deadline_s=args.deadline_s,
            mix=mix,
            spread=args.length_spread,
        )
    )
    print(json.dumps(result["table"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
