"""Where a draft model's step goes: vLLM's own engine, in this process, timed pass by pass.

The spec map (``spec_map.py``) found a draft model's step costing far more beside its target than
the draft's size predicts, even at k = 0 (docs/gpu-results/HISTORY.md, "Why a draft model costs
what it does"). This part says where that time goes.
Each configuration runs in a subprocess of its own (one engine on the GPU at a time) with vLLM's
engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that the seam's probe on vLLM's
classes (:func:`worker.vllm_internals.probes.probe_drafter`: vLLM 0.32's V1 runner, which 0.34 does
not have) sees the steps:

- every drafter pass (``SpecDecodeBaseProposer.propose``), timed between two device
  synchronisations, with its k and batch size;
- every drafter forward's batch descriptor: the CUDA-graph mode vLLM dispatched and the padded size;
- the engine steps (the target's ``execute_model`` calls) and the wall time of each wave;
- one wave under ``torch.profiler``: the top operators by self CPU and by self device time.

The synchronisations cost the async scheduler its overlap, so the pass times are upper bounds of a
pass's share of a step; the wave's tok/s is measured in a second wave without the hooks' syncs.

A configuration is ``none`` or ``DRAFT:K:LENGTH``, read as the spec map reads them
(``spec_map_config.speculative_config``: ``ngram``, a draft model, or an EAGLE-3 head's path run as vLLM's
``eagle3``; ``LENGTH`` a synthetic mean acceptance length, or ``real``), optionally with
``+key=value`` entries of vLLM's speculative config (``+enforce_eager=true``,
``+disable_padded_drafter_batch=true``) or ``+engine.key=value`` engine arguments
(``+engine.enforce_eager=true``).

    python -m worker.tools.bench.draft_step --model M --out DIR --config none --config M-1b:4:2.5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from worker.tools.bench.spec_map_config import speculative_config

__all__ = ["main", "parse_config"]


def _value(text: str) -> Any:
    """A ``+key=value`` value: JSON where it parses (numbers, booleans, lists), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_config(name: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``(speculative_config or None, more engine arguments)`` for configuration ``name``."""
    base, *extra = name.split("+")
    spec: dict[str, Any] | None = None
    if base != "none":
        try:
            draft, k_text, length = base.rsplit(":", 2)
            spec = speculative_config(draft, int(k_text), length)
        except ValueError:
            raise ValueError(f"{name!r} is not none or DRAFT:K:LENGTH[+key=value...]") from None
    engine: dict[str, Any] = {}
    for pair in extra:
        key, sep, value = pair.partition("=")
        if not (key and sep):
            raise ValueError(f"{pair!r}: extras are +key=value pairs")
        if key.startswith("engine."):
            engine[key.removeprefix("engine.")] = _value(value)
        elif spec is None:
            raise ValueError(f"{pair!r}: a speculative setting on a configuration without speculation")
        else:
            spec[key] = _value(value)
    return spec, engine


def _summary(values: list[float]) -> dict[str, float]:
    """Count, median, min and max of a list of milliseconds."""
    ordered = sorted(values)
    return {"n": len(ordered), "median": ordered[len(ordered) // 2], "min": ordered[0], "max": ordered[-1]}


def run_one(
    model: str, name: str, *, concurrency: list[int], max_tokens: int, profile_dir: Path | None
) -> dict[str, Any]:
    """One configuration's figures (run in a subprocess of its own: see ``main``)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if profile_dir is not None:
        os.environ["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"  # vLLM's own record_function scopes
    from worker.vllm_internals.probes import DrafterRecords, probe_drafter

    records = DrafterRecords()
    probe_drafter(records)
    import torch
    from vllm import LLM, SamplingParams

    from worker.boot.engine_args import TINY_KV_CACHE_BYTES

    spec, engine = parse_config(name)
    kwargs: dict[str, Any] = {
        "model": model,
        "load_format": "dummy",
        "max_model_len": 2048,
        "max_num_seqs": max(256, max(concurrency)),
        **engine,
    }
    if torch.cuda.is_available():
        kwargs.setdefault("gpu_memory_utilization", 0.85)
    else:  # vLLM's CPU build reads the utilisation as a share of RAM: a small cache for tiny models
        kwargs.setdefault("kv_cache_memory_bytes", TINY_KV_CACHE_BYTES)
    if spec is not None:
        kwargs["speculative_config"] = spec
    boot = time.perf_counter()
    offline = LLM(**kwargs)
    result: dict[str, Any] = {
        "config": name,
        "engine_args": dict(kwargs),
        "boot_s": time.perf_counter() - boot,
    }
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    offline.generate([prompt], params, use_tqdm=False)  # warm-up
    rows = []
    for n in concurrency:
        prompts = [f"{i} {prompt}" for i in range(n)]
        start = time.perf_counter()
        offline.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        records.clear()
        records.is_on = True
        hooked = time.perf_counter()
        offline.generate(prompts, params, use_tqdm=False)
        hooked_wall = time.perf_counter() - hooked
        records.is_on = False
        steps = records.num_steps  # 0 on vLLM's V2 runner: the probe is on V1's classes
        row: dict[str, Any] = {
            "concurrency": n,
            "tok_s": n * max_tokens / wall,
            "steps_hooked": steps,
            "step_ms_hooked": hooked_wall * 1e3 / steps if steps else None,
            "propose_ms": {},
            "dispatch": {},
        }
        by_k: dict[int, list[float]] = {}
        for k, ms in records.passes:
            by_k.setdefault(k, []).append(ms)
        row["propose_ms"] = {str(k): _summary(v) for k, v in sorted(by_k.items())}
        counts: dict[str, int] = {}
        for tokens, mode, padded in records.dispatches:
            key = f"{tokens}->{padded} {mode}"
            counts[key] = counts.get(key, 0) + 1
        row["dispatch"] = dict(sorted(counts.items(), key=lambda item: -item[1])[:12])
        rows.append(row)
        step = "no V1 steps seen" if row["step_ms_hooked"] is None else f"{row['step_ms_hooked']:.2f} ms"
        print(
            f"draft_step {name} c={n}: {row['tok_s']:.0f} tok/s, hooked step {step} over {steps} steps, "
            f"propose {row['propose_ms']}, dispatch {row['dispatch']}",
            flush=True,
        )
    result["rows"] = rows
    if profile_dir is not None:
        from torch.profiler import ProfilerActivity, profile

        profile_dir.mkdir(parents=True, exist_ok=True)
        prompts = [f"{i} {prompt}" for i in range(concurrency[0])]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            offline.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True), use_tqdm=False)
        averages = prof.key_averages()
        slug = name.replace("/", "_").replace(":", "_").replace("+", "_")
        text = "\n".join(
            [
                f"# {name}, concurrency {concurrency[0]}, 32 tokens",
                averages.table(sort_by="self_cpu_time_total", row_limit=40),
                averages.table(sort_by="self_cuda_time_total", row_limit=40),
                averages.table(sort_by="cpu_time_total", row_limit=40),
            ]
        )
        (profile_dir / f"profile-{slug}.txt").write_text(text)
    del offline
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.tools.bench.draft_step", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", required=True, help="the target (a config directory, served with dummy weights)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--config", action="append", dest="configs", help="a configuration (module docstring); repeat for more"
    )
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="a torch.profiler table per configuration")
    parser.add_argument("--deadline-s", type=float, default=0.0, help="start no configuration after this")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.one:
        result = run_one(
            args.model,
            args.one,
            concurrency=concurrency,
            max_tokens=args.max_tokens,
            profile_dir=args.out if args.profile else None,
        )
        print("draft_step_json " + json.dumps(result), flush=True)
        return 0
    results = []
    start = time.monotonic()
    configs = args.configs or ["none"]
    for name in configs:
        parse_config(name)  # a bad name fails before any engine boots
    for name in configs:
        if args.deadline_s and time.monotonic() - start > args.deadline_s:
            print(f"draft_step {name}: not started (past the deadline)", flush=True)
            continue
        cmd = [
            sys.executable,
            "-m",
            "worker.tools.bench.draft_step",
            "--model",
            args.model,
            "--out",
            str(args.out),
            "--concurrency",
            args.concurrency,
            "--max-tokens",
            str(args.max_tokens),
            "--one",
            name,
        ]
        if args.profile:
            cmd.append("--profile")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
        for line in proc.stdout.splitlines():
            if line.startswith("draft_step_json "):
                results.append(json.loads(line.removeprefix("draft_step_json ")))
            else:
                print(line, flush=True)
        if proc.returncode:
            results.append({"config": name, "error": f"exit {proc.returncode}"})
        (args.out / "draft_step.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
