"""Speculative decoding per draft and k against no speculation, with the measured acceptance."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from worker.config import Settings, load_settings
from worker.tools.bench.engines import EnginePool
from worker.tools.bench.spec_map_config import config_env
from worker.tools.bench.timing import PROMPT, ratio


# ------------------------------------------------------------------------------ speculative
async def _spec_point(
    settings: Settings, *, num_requests: int, max_tokens: int, rounds: int = 1, pool: EnginePool
) -> dict[str, Any]:
    """One engine: a warm-up request, then ``rounds`` rounds of the same requests one at a time.
    Decode speed is the median of the rounds' (a round's: its tokens over its decode time); the
    acceptance counts are over every round."""
    from worker.metrics import AcceptanceWatchdog
    from worker.schema import parse_request

    # The worker's acceptance watchdog with the worker's settings, fed every request of the point
    # (warm-up included): whether a deployment of this draft would be flagged as not paying.
    watchdog = AcceptanceWatchdog(
        threshold=settings.acceptance_watchdog_threshold, window=settings.acceptance_watchdog_window
    )
    is_speculating = settings.resolved_speculative_config is not None
    engine = await pool.get(settings)
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
        warm_up = [c async for c in engine.generate(requests[0])]
        if warm_up[-1].spec_decode is not None:
            watchdog.observe(
                num_steps=warm_up[-1].spec_decode.num_spec_steps,
                num_accepted=warm_up[-1].spec_decode.num_accepted_draft_tokens,
            )
        counters_before = engine_spec_counters()
        drafted = accepted = steps = 0
        round_tok_s: list[float] = []
        for _ in range(rounds):
            tokens, decode_s = 0, 0.0
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
                            watchdog.observe(
                                num_steps=chunk.spec_decode.num_spec_steps,
                                num_accepted=chunk.spec_decode.num_accepted_draft_tokens,
                            )
            if decode_s:
                round_tok_s.append(tokens / decode_s)
        counted = await spec_counters_since(counters_before, num_draft_tokens=drafted)
        return {
            "decode_tok_s": statistics.median(round_tok_s) if round_tok_s else None,
            "round_tok_s": round_tok_s,
            "engine_counters": counted,
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "num_spec_steps": steps,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / steps if steps else None,
            "accepted_per_step": accepted / steps if steps else None,
            "ms_per_token": 1000 / statistics.median(round_tok_s) if round_tok_s else None,
            "watchdog_low": watchdog.is_low if is_speculating else None,
            "watchdog_requests": rounds * len(requests) + 1 if is_speculating else None,
        }
    finally:
        pool.release(engine)


_SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


async def spec_counters_since(
    before: dict[str, float], *, num_draft_tokens: int, timeout_s: float = 5.0
) -> dict[str, int]:
    """vLLM's spec-decode counters since ``before`` (an ``engine_spec_counters()`` reading), short
    names. The frontend records a step's stats just after handing out its outputs: read until the
    drafted-token counter reaches ``num_draft_tokens`` (what the requests reported), or until
    ``timeout_s`` passes (then the difference stands, for the caller to compare)."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = engine_spec_counters()
        counted = {key.removeprefix("vllm:spec_decode_"): int(after[key] - before[key]) for key in after}
        if counted["num_draft_tokens"] >= num_draft_tokens or time.monotonic() > deadline:
            return counted
        await asyncio.sleep(0.01)


def engine_spec_counters() -> dict[str, float]:
    """vLLM's engine-wide spec-decode counters (Prometheus, this process), 0 where absent."""
    from prometheus_client import REGISTRY

    totals = dict.fromkeys(_SPEC_COUNTERS, 0.0)
    for family in REGISTRY.collect():
        if family.name in totals:
            totals[family.name] = sum(x.value for x in family.samples if x.name.endswith("_total"))
    return totals


async def bench_spec(
    env: dict[str, str],
    *,
    drafts: list[str],
    ks: list[int],
    num_requests: int,
    max_tokens: int,
    rounds: int = 1,
    pool: EnginePool | None = None,
) -> dict[str, Any]:
    pool = pool or EnginePool(share=False)
    base_env = config_env(env, "none")  # whatever speculation the environment sets, none
    point_args = {"num_requests": num_requests, "max_tokens": max_tokens, "rounds": rounds}
    baseline = await _spec_point(load_settings(base_env), **point_args, pool=pool)
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
            point = await _spec_point(load_settings(point_env), **point_args, pool=pool)
            point.update(draft=draft, k=k, speedup=ratio(point["decode_tok_s"], baseline["decode_tok_s"]))
            point["pays_off"] = bool(point["speedup"] and point["speedup"] > 1.0)
            rows.append(point)
            print(
                f"spec {draft} k={k}: speedup {point['speedup']:.2f}, mean acceptance length "
                f"{point['mean_acceptance_length'] or 0:.2f}",
                flush=True,
            )
    return {**point_args, "baseline": baseline, "rows": rows}
