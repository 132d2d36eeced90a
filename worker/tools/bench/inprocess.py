"""The benchmark's plan (what a run measures, and at what sizes) and the parts that drive engines
in this process (overhead, first_request, spec, lossless), run in one event loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.config import Settings
from worker.tools.bench.coldstart import bench_first_request
from worker.tools.bench.engines import EnginePool
from worker.tools.bench.lossless import bench_lossless
from worker.tools.bench.overhead import bench_overhead
from worker.tools.bench.report import write_report
from worker.tools.bench.spec import bench_spec

__all__ = ["Plan", "run_in_process"]


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
    spec_rounds: int = 1
    raw_input: str = "text"
    stats_off_baseline: bool = False
    aa_baseline: bool = False
    smoke: bool = False
    lossless_samples: int = 500
    lossless_sampling: list[dict[str, Any]] = field(default_factory=lambda: [{"temperature": 1.0}])


async def run_in_process(
    plan: Plan, settings: Settings, env: dict[str, str], results: dict[str, Any], out: Path
) -> None:
    """The parts that drive engines in this process, in one event loop (an engine serves only the
    loop it was booted in): with ``--smoke`` they share one engine per configuration, and the
    first-request part goes first, so that its request is the engine's first."""
    pool = EnginePool(share=plan.smoke)
    load: dict[str, Any] = {
        "concurrencies": plan.concurrencies,
        "num_requests": plan.num_requests,
        "max_tokens": plan.max_tokens,
        "repeats": plan.repeats,
    }
    try:
        if "first_request" in plan.parts:
            idle_s = 0.0 if plan.smoke else 1.0  # --smoke checks the part runs: no idle gaps
            results["first_request"] = await bench_first_request(settings, idle_s=idle_s, pool=pool)
            write_report(results, out)
        if "overhead" in plan.parts:

            def progress(overhead: dict[str, Any]) -> None:
                results["overhead"] = overhead
                write_report(results, out)

            results["overhead"] = await bench_overhead(
                settings,
                **load,
                raw_input=plan.raw_input,
                stats_off_baseline=plan.stats_off_baseline,
                aa_baseline=plan.aa_baseline,
                on_progress=progress,  # its last call wrote the complete report
                pool=pool,
            )
        if "spec" in plan.parts:
            results["spec"] = await bench_spec(
                env,
                drafts=plan.drafts,
                ks=plan.ks,
                num_requests=plan.spec_requests,
                max_tokens=plan.max_tokens,
                rounds=plan.spec_rounds,
                pool=pool,
            )
            write_report(results, out)
        if "lossless" in plan.parts:
            draft = {"SPECULATIVE_MODEL": "tiny:noisy", "NUM_SPECULATIVE_TOKENS": "3"}
            configs = {
                "draft_model": draft,
                "draft_model, stats path off": {**draft, "PER_REQUEST_SPEC_DECODE_METRICS": "none"},
                "ngram": {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "3"},
            }
            results["lossless"] = []
            for sampling in plan.lossless_sampling:
                results["lossless"].append(
                    await bench_lossless(
                        env, configs=configs, sampling=sampling, num_samples=plan.lossless_samples, pool=pool
                    )
                )
                write_report(results, out)
    finally:
        pool.close()
    results["engine_boots"] = results.get("engine_boots", 0) + pool.num_boots
