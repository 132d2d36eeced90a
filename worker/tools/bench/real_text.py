"""``python -m worker bench --real-text``: speculation's acceptance on real text, per task.

Each task of the real-text set (:mod:`.real_text_tasks`) runs greedily, one at a time, on an engine
of each k in ``--ks``, and on one without speculation unless ``--skip-baseline``, in ``--repeats``
rounds of the whole set (decode speed: the rounds' median; the counts are the same every round). The model is what
``MODEL_NAME`` says (unset: the default, SmolLM2); what drafts is what the environment configures
(``SPECULATIVE_METHOD``, ``SPECULATIVE_MODEL``, ``SPECULATIVE_CONFIG``, ``SPECULATION_CONTROL``),
n-gram where it configures none; the run sets only ``NUM_SPECULATIVE_TOKENS``. So the model as its
own draft is ``SPECULATIVE_MODEL=<the model's path>``, and ``auto`` is ``SPECULATION_CONTROL=auto``
(k then the highest the controller may choose).

Per task and k, from the exact per-request stats: the mean acceptance length (tokens per verify
step, ``1 + accepted / steps``) and the accepted draft tokens per step, the histogram, the decode
speed against the baseline's, and two verdicts on the same counts: the acceptance watchdog's (is
the length below ``ACCEPTANCE_WATCHDOG_THRESHOLD``) and the cost model's that ``auto`` decides by
(is it below :func:`worker.speculation.cost.break_even_length` at one stream; the model's figures
are the H200's, whatever this runs on). Their difference: docs/speculation.md.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.config import Settings, load_settings
from worker.tools.bench.real_text_tasks import REAL_TEXT_VERSION, TASKS, RealTextTask

if TYPE_CHECKING:
    from worker.engine import Engine

__all__ = ["bench_real_text", "cost_key", "render_real_text", "run_task", "task_row"]

_SPECULATION = ("SPECULATIVE_METHOD", "SPECULATIVE_MODEL", "SPECULATIVE_CONFIG")


def cost_key(settings: Settings) -> str:
    """Which step costs of :data:`worker.speculation.cost.STEP_COSTS` price this drafter on a GPU
    under ``auto`` (n-gram runs there as ``ngram_gpu``, with async scheduling)."""
    drafter = settings.drafter
    return drafter if drafter in ("ngram", "eagle") else "draft_model"


async def run_task(engine: Engine, task: RealTextTask, *, max_tokens: int | None = None) -> dict[str, Any]:
    """One task, greedy, alone on ``engine``: its answer, counts and decode speed."""
    from worker.schema import parse_request

    request = parse_request(
        {
            "messages": [{"role": "user", "content": task.prompt}],
            "sampling_params": {"max_tokens": max_tokens or task.max_tokens, "temperature": 0},
        }
    )
    text, first, final = "", None, None
    async for chunk in engine.generate(request):
        text += chunk.text
        if chunk.num_tokens and first is None:
            first = time.perf_counter()
        if chunk.is_final:
            final = chunk
    end = time.perf_counter()
    assert final is not None and final.usage is not None
    tokens = final.usage.completion_tokens
    spec = final.spec_decode
    return {
        "task": task.name,
        "kind": task.kind,
        "text": text,
        "finish_reason": final.finish_reason,
        "completion_tokens": tokens,
        "decode_tok_s": (tokens - 1) / (end - first) if first is not None and end > first and tokens > 1 else None,
        "spec_decode": None if spec is None else spec.model_dump(),
    }


def task_row(result: dict[str, Any], *, k: int, threshold: float, break_even: float) -> dict[str, Any]:
    """A task's figures at k from its exact counts, and the two verdicts on them."""
    spec = result["spec_decode"]
    steps, accepted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"]
    length = 1 + accepted / steps if steps else None
    return {
        "task": result["task"],
        "kind": result["kind"],
        "k": k,
        "num_spec_steps": steps,
        "num_draft_tokens": spec["num_draft_tokens"],
        "num_accepted_draft_tokens": accepted,
        "acceptance_histogram": spec["acceptance_histogram"],
        "mean_acceptance_length": length,
        "accepted_per_step": accepted / steps if steps else None,
        "watchdog_low": length is not None and length < threshold,
        "break_even_length": break_even,
        "costs_more_than_it_saves": length is not None and length < break_even,
    }


async def _rounds(engine: Engine, *, repeats: int, max_tokens: int | None) -> list[dict[str, Any]]:
    """Each task ``repeats`` times in turn (rounds of the whole set): the first round's answer and
    counts (greedy: every round's are the same), the median of the rounds' decode speeds."""
    rounds = [[await run_task(engine, task, max_tokens=max_tokens) for task in TASKS] for _ in range(repeats)]
    answers = []
    for i, first in enumerate(rounds[0]):
        speeds = [r[i]["decode_tok_s"] for r in rounds if r[i]["decode_tok_s"] is not None]
        answers.append({**first, "round_tok_s": speeds, "decode_tok_s": statistics.median(speeds) if speeds else None})
    return answers


async def bench_real_text(
    env: dict[str, str], *, ks: list[int], with_baseline: bool, max_tokens: int | None, repeats: int, out: Path
) -> dict[str, Any]:
    """Every task on an engine per k (and one without speculation), booted one after another."""
    from worker.runtime import boot_engine
    from worker.speculation.cost import STEP_COSTS, break_even_length

    spec_env = {k: v for k, v in env.items() if k != "NUM_SPECULATIVE_TOKENS"}
    if not any(spec_env.get(name) for name in _SPECULATION):
        spec_env["SPECULATIVE_METHOD"] = "ngram"
    results: dict[str, Any] = {"version": REAL_TEXT_VERSION, "ks": ks, "repeats": repeats, "baseline": None, "runs": []}
    configs: list[tuple[int, dict[str, str]]] = [(k, {**spec_env, "NUM_SPECULATIVE_TOKENS": str(k)}) for k in ks]
    if with_baseline:
        plain = {k: v for k, v in env.items() if k not in (*_SPECULATION, "NUM_SPECULATIVE_TOKENS")}
        configs.insert(0, (0, {**plain, "SPECULATIVE_METHOD": "none", "SPECULATION_CONTROL": ""}))
    for k, config in configs:
        settings = load_settings(config)
        started = time.perf_counter()
        engine = await boot_engine(settings, mode="serverless")
        boot_s = time.perf_counter() - started
        try:
            answers = await _rounds(engine, repeats=repeats, max_tokens=max_tokens)
        finally:
            engine.shutdown()
        run: dict[str, Any] = {"k": k, "model": settings.target_ref, "boot_s": boot_s, "answers": answers}
        if k:
            cost = cost_key(settings)
            break_even = break_even_length(STEP_COSTS[cost], batch_size=1, k=k)
            threshold = settings.acceptance_watchdog_threshold
            run.update(cost=cost, speculative_config=settings.resolved_speculative_config)
            run["rows"] = [task_row(a, k=k, threshold=threshold, break_even=break_even) for a in answers]
            results["runs"].append(run)
        else:
            results["baseline"] = run
        out.mkdir(parents=True, exist_ok=True)
        (out / "real-text.json").write_text(json.dumps(results, indent=1) + "\n")
        print(f"real-text k={k}: booted in {boot_s:.0f} s, {len(answers)} tasks", flush=True)
    return results


def _ratio(run: dict[str, Any], baseline: dict[str, Any] | None, task: str) -> float | None:
    if baseline is None:
        return None
    mine = next(a["decode_tok_s"] for a in run["answers"] if a["task"] == task)
    base = next(a["decode_tok_s"] for a in baseline["answers"] if a["task"] == task)
    return mine / base if mine and base else None


def render_real_text(results: dict[str, Any]) -> str:
    """The per-task table: for each k, the mean acceptance length and the accepted tokens per step
    (and the decode speed against no speculation, with a baseline); then each kind's."""
    runs = results["runs"]
    header = "| task (kind) | " + " | ".join(f"k = {run['k']}: L / acc. per step" for run in runs) + " |"
    lines = [header, "|---" * (len(runs) + 1) + "|"]
    for task in TASKS:
        cells = []
        for run in runs:
            row = next(r for r in run["rows"] if r["task"] == task.name)
            length, per_step = row["mean_acceptance_length"], row["accepted_per_step"]
            cell = f"{length:.2f} / {per_step:.2f}" if row["num_spec_steps"] else "-"
            speedup = _ratio(run, results["baseline"], task.name)
            cells.append(cell + (f" ({speedup:.2f}x)" if speedup else ""))
        lines.append(f"| {task.name} ({task.kind}) | " + " | ".join(cells) + " |")
    for kind in dict.fromkeys(task.kind for task in TASKS):
        cells = []
        for run in runs:
            rows = [r for r in run["rows"] if r["kind"] == kind]
            steps = sum(r["num_spec_steps"] for r in rows)
            accepted = sum(r["num_accepted_draft_tokens"] for r in rows)
            cells.append(f"{1 + accepted / steps:.2f} / {accepted / steps:.2f}" if steps else "-")
        lines.append(f"| **{kind}** | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(
    env: dict[str, str], *, ks: list[int], with_baseline: bool, max_tokens: int | None, repeats: int, out: Path
) -> int:
    run = bench_real_text(env, ks=ks, with_baseline=with_baseline, max_tokens=max_tokens, repeats=repeats, out=out)
    results = asyncio.run(run)
    print(render_real_text(results))
    return 0
