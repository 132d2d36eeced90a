"""``python -m worker bench``: parse the command line, run the parts, write the report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from worker.config import Settings, load_settings
from worker.errors import ConfigError
from worker.tools.bench.coldstart import bench_coldstart
from worker.tools.bench.inprocess import Plan, run_in_process
from worker.tools.bench.report import render_markdown, render_saved, write_report
from worker.tools.bench.roofline import bench_roofline
from worker.tools.bench.servers import bench_pod, boot_order
from worker.tools.bench.shapes import LLAMA3_SHAPES, make_shape_model, write_random_weights
from worker.tools.bench.stats_path import bench_stats_path
from worker.tools.sizing import GPUS


# ------------------------------------------------------------------------------ entry
def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(Exception):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run(
    plan: Plan, *, out: Path, settings: Settings, env: dict[str, str], gpu: str | None, command: str
) -> dict[str, Any]:
    """Every part of ``plan``; ``settings``: ``env``'s, loaded (and so checked) by the caller."""
    out.mkdir(parents=True, exist_ok=True)
    from worker.boot.launch import build_args  # checks the vLLM install early
    from worker.boot.plan import build_plan  # resolves tiny models

    model_path = build_args(build_plan(settings, mode="serverless")).model
    results: dict[str, Any] = {"command": command, "machine": _machine(), "plan": asdict(plan), "label": plan.label}
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            results["gpu"] = torch.cuda.get_device_name(0)
    with contextlib.suppress(Exception):
        from worker.vllm_internals.check import installed_version

        results["vllm_version"] = installed_version()
    # The load both comparisons drive, the same for each.
    load: dict[str, Any] = {
        "concurrencies": plan.concurrencies,
        "num_requests": plan.num_requests,
        "max_tokens": plan.max_tokens,
        "repeats": plan.repeats,
    }
    if {"overhead", "first_request", "spec", "lossless"} & set(plan.parts):
        asyncio.run(run_in_process(plan, settings, env, results, out))
    if "pod" in plan.parts:
        results["pod"] = bench_pod(settings, env, model_path=model_path, out=out, **load)
        results["engine_boots"] = results.get("engine_boots", 0) + 2
        write_report(results, out)
    if "coldstart" in plan.parts:
        # --smoke: the handler's boot only (vLLM's server boots in the pod part, through the same code).
        with_server = not plan.smoke
        results["coldstart"] = bench_coldstart(settings, env, model_path=model_path, out=out, with_server=with_server)
        results["engine_boots"] = results.get("engine_boots", 0) + 1 + with_server
        write_report(results, out)
    if "coldstart_handler" in plan.parts:
        results["coldstart_handler"] = bench_coldstart(settings, env, model_path=model_path, out=out, with_server=False)
        results["engine_boots"] = results.get("engine_boots", 0) + 1
        write_report(results, out)
    if "stats_path" in plan.parts:
        results["stats_path"] = bench_stats_path(
            plan.concurrencies,
            k=settings.num_speculative_tokens or 4,
            steps=80 if plan.smoke else 800,  # --smoke checks the part runs, not its figures
            repeats=1 if plan.smoke else 7,
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


ALL_PARTS = [
    "overhead",
    "pod",
    "coldstart",
    "coldstart_handler",
    "first_request",
    "spec",
    "stats_path",
    "roofline",
    "lossless",
]


def _positive_ints(text: str) -> list[int]:
    """A comma-separated list of positive integers (argparse names the flag in its error)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive integers separated by commas") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive integers separated by commas")
    return values


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def bench_env(environ: Mapping[str, str], *, max_concurrency: int) -> dict[str, str]:
    """The benchmark's environment from ``environ``. Overhead and the server comparison measure
    the serving path, so speculation is off there unless the environment configures it
    (``SPECULATIVE_METHOD``, or ``SPECULATIVE_CONFIG``: the pod and vLLM's server with one drafter);
    the spec and lossless parts set their own drafts over a baseline without any. The target is
    the tiny one unless named, as the parts' drafts are the tiny models' (``--drafts``)."""
    env = dict(environ)
    if "SPECULATIVE_CONFIG" not in env:
        env.setdefault("SPECULATIVE_METHOD", "none")
    env.setdefault("MODEL_NAME", "tiny:target")
    env.setdefault("MAX_NUM_SEQS", str(max_concurrency))
    return env


def main(argv: list[str] | None = None) -> int:
    line = list(sys.argv[1:] if argv is None else argv)
    if any(arg == "--stage" or arg.startswith("--stage=") for arg in line):  # the GPU stages' runner
        from worker.tools.bench import stage_runner

        return stage_runner.main(line)
    parser = argparse.ArgumentParser(
        prog="python -m worker bench", description="benchmark the worker against its peers"
    )
    parser.add_argument(
        "--stage",
        metavar="NAME",
        help="run GPU stages instead: worker/tools/bench/stages.py (python -m worker bench --stage list names them)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--parts", default=",".join(ALL_PARTS), help=f"comma-separated subset of {ALL_PARTS}")
    parser.add_argument(
        "--concurrency", type=_positive_ints, default="1,4,16", help="comma-separated concurrency levels"
    )
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
    parser.add_argument("--ks", type=_positive_ints, default="2,4,8", help="comma-separated speculative tokens")
    parser.add_argument("--spec-requests", type=int, default=4)
    parser.add_argument(
        "--spec-rounds",
        type=int,
        default=1,
        help="spec part: rounds of the requests per point on its engine; decode speed is the rounds' median",
    )
    parser.add_argument(
        "--lossless-samples", type=int, default=500, help="lossless part: completions per engine and configuration"
    )
    parser.add_argument(
        "--lossless-top-p",
        action="store_true",
        help="lossless part: also temperature 0.7 with top-p 0.9 (a speculating CPU engine dies on top-p)",
    )
    parser.add_argument("--gpu", choices=sorted(GPUS), help="the GPU this runs on, for the roofline fraction")
    parser.add_argument("--label", default="", help="a name for this configuration, kept in the results")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes, engines shared between parts, the handler's cold start only: checks the harness, not speed",
    )
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
        "--random-weights",
        action="store_true",
        help="with --make-llama8b: also real-size bf16 safetensors of random values (to measure weight loading)",
    )
    parser.add_argument(
        "--stats-off-baseline",
        action="store_true",
        help="overhead part, speculating configs: also the handler over an engine without the exact-stats path",
    )
    parser.add_argument(
        "--aa-baseline",
        action="store_true",
        help="overhead part: also the handler over a second, identical engine (an A/A control for engine pairs)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="print Markdown for saved bench.json files and boot logs, and exit",
    )
    parser.add_argument(
        "--pool",
        action="store_true",
        help="with --render: pool the pod runs files given (pod-runs.json) into one table, each server's "
        "medians over all their runs",
    )
    parser.add_argument(
        "--render-page",
        action="store_true",
        help="write docs/benchmarks.md, its plots and the README's headline table from docs/gpu-results/results.json "
        "and the files it names (worker/tools/bench/results_page.py), and exit; with --check write nothing, exit 1 "
        "where they differ",
    )
    parser.add_argument("--check", action="store_true", help="with --render-page: compare, write nothing")
    parser.add_argument(
        "--real-text",
        action="store_true",
        help="acceptance on the real-text set, per task, at each k of --ks (default 1,2,3,4), on MODEL_NAME with "
        "the speculation the environment configures (n-gram where none): worker/tools/bench/real_text.py",
    )
    parser.add_argument("--skip-baseline", action="store_true", help="with --real-text: no engine without speculation")
    args = parser.parse_args(argv)
    if args.render_page:
        from worker.tools.bench import results_page

        return results_page.main(check=args.check)
    if args.real_text:
        from worker.tools.bench import real_text

        given = set(argv if argv is not None else sys.argv[1:])
        return real_text.main(
            dict(os.environ),
            ks=args.ks if "--ks" in given else [1, 2, 3, 4],
            with_baseline=not args.skip_baseline,
            max_tokens=args.max_tokens if "--max-tokens" in given else None,
            repeats=args.repeats,
            out=args.out,
        )
    if args.render:
        missing = [str(path) for path in args.render if not path.is_file()]
        if missing:
            parser.error(f"argument --render: no such file: {', '.join(missing)}")
        try:
            print(render_saved(args.render, pool=args.pool))
        except (ValueError, KeyError, TypeError) as exc:  # not a file the benchmark wrote
            parser.error(f"argument --render: cannot read the results ({type(exc).__name__}: {exc})")
        return 0
    if args.make_llama8b:
        make_shape_model(args.make_llama8b, awq=args.awq, shape=args.shape)
        if args.random_weights:
            started = time.perf_counter()
            written = write_random_weights(args.make_llama8b)
            print(f"wrote {written / 1e9:.2f} GB of random weights in {time.perf_counter() - started:.1f} s")
        return 0
    plan = Plan(
        parts=[p for p in args.parts.split(",") if p],
        concurrencies=args.concurrency,
        num_requests=args.num_requests,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        drafts=args.drafts.split(","),
        ks=args.ks,
        spec_requests=args.spec_requests,
        spec_rounds=args.spec_rounds,
        label=args.label,
        raw_input=args.raw_input,
        stats_off_baseline=args.stats_off_baseline,
        aa_baseline=args.aa_baseline,
        lossless_samples=args.lossless_samples,
        lossless_sampling=[{"temperature": 1.0}]
        + ([{"temperature": 0.7, "top_p": 0.9}] if args.lossless_top_p else []),
    )
    if args.smoke:
        given = set(argv if argv is not None else sys.argv[1:])
        plan = Plan(
            parts=plan.parts,
            concurrencies=[1, 2],
            num_requests=4,
            max_tokens=16,
            repeats=1,
            drafts=plan.drafts if "--drafts" in given else ["tiny:noisy"],
            ks=plan.ks if "--ks" in given else [2],
            spec_requests=plan.spec_requests if "--spec-requests" in given else 1,
            spec_rounds=plan.spec_rounds,
            label=plan.label,
            stats_off_baseline=plan.stats_off_baseline,
            aa_baseline=plan.aa_baseline,
            lossless_samples=min(plan.lossless_samples, 40),
            lossless_sampling=plan.lossless_sampling,
            smoke=True,
        )
    unknown = set(plan.parts) - set(ALL_PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    env = bench_env(os.environ, max_concurrency=max(plan.concurrencies))
    try:  # a configuration that cannot serve: one line, before anything boots
        settings = load_settings(env)
        if "pod" in plan.parts:
            boot_order(env)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = "python -m worker bench " + " ".join(argv if argv is not None else sys.argv[1:])
    # A benchmark stopped with SIGTERM (e.g. by `timeout`) must still stop the servers it started
    # (each in its own session): turn the signal into an exit that runs their clean-up.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    results = run(plan, out=args.out, settings=settings, env=env, gpu=args.gpu, command=command.strip())
    print(render_markdown(results))
    return 0
