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
import json
from pathlib import Path

from worker.tools.soak.run import SoakResult, run_soak

__all__ = ["SoakResult", "main", "run_soak"]


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
    from worker.tools.soak.plot import plot

    plot(result, args.out / "soak.png")
    print(json.dumps({k: v for k, v in result.summary.items() if k != "by_scenario"}, indent=1))
    return 0 if result.summary["met"] else 1
