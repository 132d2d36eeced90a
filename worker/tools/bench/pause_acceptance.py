"""Does a draft model accept as well after a stretch without drafting? Mean acceptance length after
k = 0 phases of given lengths, against an engine that never paused, on the same text.

Why: where the worker skips the draft's pass at k = 0 (``worker.vllm_internals.draft_skip``), its
KV cache misses every token decoded while off, and the step that drafts again must catch it up
first. Synthetic acceptance never reads the draft's proposals, so a broken catch-up looks fine
under it: this part uses real drafts of known acceptance (the tiny target as its own draft: every
draft accepted at temperature 0; its noisy copy: some), and any other draft given.

How, per pause length ``N`` (default 8, 32, 128), on an engine whose schedule drafts k tokens for
a batch of one and none for two or more (``SPECULATIVE_TOKENS_BY_BATCH=1-1:K,2-1024:0``, static):

- ``after_pause``: request R (prompt A) and a pauser P (prompt B, ``N`` tokens) start together: the
  batch of two drafts nothing until P ends, so R's prompt and its first ``N`` tokens are decoded
  without the draft, and R then drafts alone. Its acceptance counts only the steps after the pause.
  The reference: an engine that drafts at every step (static k), given A plus R's first ``N``
  tokens as the prompt, the same continuation;
- ``prefix_hit``: then, on the paused engine, request H whose prompt is B plus P's output: it
  hits the prefix-cache blocks P wrote while the draft was off (and never caught up: P ended off),
  and drafts alone. The reference: H on the never-paused engine.

Two controls, each the paused engine again under the seam's test hook
(``RUNPOD_WORKER_DRAFT_SKIP_TEST``): ``keep_pass``, vLLM's own pass at k = 0 (the same pauses, the
same step alignment, nothing skipped: the skip and catch-up must match it, where the never-paused
reference differs by where each engine's drafting windows fall); and with ``--no-catch-up``,
the skip without its catch-up, whose acceptance after a pause must fall, or the check could not
fail. On the CPU build (vLLM 0.32's V1 proposer, which keeps its pass at k = 0) nothing is
skipped: the part then checks the harness.

    python -m worker.tools.bench.pause_acceptance --out DIR --drafts tiny:target,tiny:noisy --k 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from worker.config import load_settings
from worker.tools.bench.engines import EnginePool
from worker.tools.bench.spec_map_config import config_env
from worker.vllm_internals.draft_catch_up import TEST_ENV

__all__ = ["bench_pause_acceptance", "bench_pause_lossless", "main"]

PROMPT_A = "Write a short story about a lighthouse keeper who finds a message in a bottle.\n"
PROMPT_B = (
    "List the steps to bake bread at home, from mixing the flour and water to letting the dough rise, "
    "shaping the loaf and baking it until the crust is golden brown.\n"
)
TOLERANCE = 0.03  # the paused engine's mean acceptance length within 3% of the reference's


async def _run(engine: Any, prompt: str, max_tokens: int) -> tuple[str, float | None, int]:
    """Greedy ``max_tokens`` tokens of ``prompt``: the text, the mean acceptance length over the
    request's drafting steps (None: none), and those steps."""
    from worker.schema import parse_request

    request = parse_request(
        {"prompt": prompt, "sampling_params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    )
    text, length, steps = "", None, 0
    async for chunk in engine.generate(request):
        text += chunk.text or ""
        if chunk.is_final and chunk.spec_decode is not None:
            steps = chunk.spec_decode.num_spec_steps
            if steps:
                length = 1 + chunk.spec_decode.num_accepted_draft_tokens / steps
    return text, length, steps


async def bench_pause_lossless(
    base_env: dict[str, str],
    *,
    draft: str,
    k: int = 3,
    num_samples: int = 1000,
    num_positions: int = 8,
    temperature: float = 1.0,
    pool: EnginePool | None = None,
) -> dict[str, Any]:
    """Lossless at temperature > 0 with the skip in use: ``num_samples`` completions of
    ``num_positions`` tokens on the paused engine, each beside a pauser of 1 to ``num_positions - 2``
    tokens (its first tokens decoded without the draft, the rest drafted after a catch-up), against
    two samples of an engine without speculation (A and A', the control), position by position
    (:mod:`.lossless`'s test and thresholds)."""
    import random

    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from worker.tools.bench.lossless import PROMPT, bootstrap_threshold, compare_samples

    pool = pool or EnginePool(share=False)

    async def sample(engine: Any, seed0: int, *, paused: bool) -> list[list[int]]:
        prompt = TokensPrompt(prompt_token_ids=list(engine.llm.get_tokenizer().encode(PROMPT)))

        async def one(i: int, max_tokens: int, tag: str) -> list[int]:
            params = SamplingParams(
                max_tokens=max_tokens,
                ignore_eos=True,
                seed=seed0 + i,
                temperature=temperature,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            tokens: list[int] = []
            async for out in engine.llm.generate(prompt, params, f"pause-lossless-{tag}-{seed0}-{i}"):
                tokens = list(out.outputs[0].token_ids)
            return tokens

        if not paused:
            return list(await asyncio.gather(*(one(i, num_positions, "a") for i in range(num_samples))))
        rng = random.Random(seed0)
        samples = []
        for i in range(num_samples):  # one pair at a time: the sample drafts alone once its pauser ends
            pause = rng.randint(1, max(1, num_positions - 2))
            tokens, _ = await asyncio.gather(one(i, num_positions, "x"), one(i, pause, "p"))
            samples.append(tokens)
        return samples

    plain = await pool.boot(load_settings(config_env(base_env, "none")))
    try:
        a = await sample(plain, 0, paused=False)
        a2 = await sample(plain, 10**6, paused=False)
    finally:
        pool.release(plain)
    rng = random.Random(1234)
    thresholds = [bootstrap_threshold([s[j] for s in a + a2], num_samples, rng=rng) for j in range(num_positions)]
    engine = await pool.boot(load_settings(_env(base_env, draft, k, paused=True)))
    try:
        x = await sample(engine, 2 * 10**6, paused=True)
    finally:
        pool.release(engine)
    control, row = compare_samples(a, a2, thresholds), compare_samples(a, x, thresholds)
    return {
        "draft": draft,
        "k": k,
        "temperature": temperature,
        "num_samples": num_samples,
        "num_positions": num_positions,
        "thresholds": [round(t, 4) for t in thresholds],
        "control": {**control, "passes": not control["positions_over_threshold"]},
        "paused": {**row, "lossless": not row["positions_over_threshold"]},
    }


def _env(base: dict[str, str], draft: str, k: int, *, paused: bool) -> dict[str, str]:
    env = {key: value for key, value in base.items() if "SPECULATI" not in key}
    env.update(
        {
            "SPECULATIVE_MODEL": draft,
            "NUM_SPECULATIVE_TOKENS": str(k),
            "SPECULATION_CONTROL": "static",
            "SKIP_DRAFT_PASS": "true",
        }
    )
    if paused:
        env["SPECULATIVE_TOKENS_BY_BATCH"] = f"1-1:{k},2-1024:0"
    return env


async def _paused_runs(engine: Any, pauses: list[int], max_tokens: int) -> dict[int, dict[str, Any]]:
    runs: dict[int, dict[str, Any]] = {}
    for n in pauses:
        (r_text, r_length, r_steps), (p_text, _, _) = await asyncio.gather(
            _run(engine, PROMPT_A, n + max_tokens), _run(engine, PROMPT_B, n)
        )
        h_prompt = PROMPT_B + p_text
        _, h_length, h_steps = await _run(engine, h_prompt, max_tokens)
        runs[n] = {
            "r_text": r_text,
            "after_pause": (r_length, r_steps),
            "h_prompt": h_prompt,
            "prefix_hit": (h_length, h_steps),
        }
    return runs


async def bench_pause_acceptance(
    base_env: dict[str, str],
    *,
    drafts: list[str],
    k: int = 3,
    pauses: list[int] | None = None,
    max_tokens: int = 128,
    no_catch_up: bool = False,
    pool: EnginePool | None = None,
) -> dict[str, Any]:
    pauses = pauses or [8, 32, 128]
    pool = pool or EnginePool(share=False)
    rows: list[dict[str, Any]] = []
    for draft in drafts:
        paused = await _paused_engine_runs(pool, base_env, draft, k, None, pauses, max_tokens)
        controls = {"keep_pass": await _paused_engine_runs(pool, base_env, draft, k, "keep-pass", pauses, max_tokens)}
        if no_catch_up:
            controls["no_catch_up"] = await _paused_engine_runs(
                pool, base_env, draft, k, "no-catch-up", pauses, max_tokens
            )
        reference = await pool.boot(load_settings(_env(base_env, draft, k, paused=False)))
        try:
            for n in pauses:
                run = paused[n]
                cases = {
                    "after_pause": (PROMPT_A + _first_tokens(reference, run["r_text"], n), run["after_pause"]),
                    "prefix_hit": (run["h_prompt"], run["prefix_hit"]),
                }
                for case, (prompt, (length, steps)) in cases.items():
                    _, ref_length, ref_steps = await _run(reference, prompt, max_tokens)
                    row: dict[str, Any] = {
                        "draft": draft,
                        "k": k,
                        "pause_steps": n,
                        "case": case,
                        "mean_acceptance_length": _round(length),
                        "drafting_steps": steps,
                        "reference_mean_acceptance_length": _round(ref_length),
                        "reference_drafting_steps": ref_steps,
                    }
                    row["ratio"] = _round(length / ref_length) if length and ref_length else None
                    row["within_tolerance"] = row["ratio"] is not None and abs(row["ratio"] - 1) <= TOLERANCE
                    for name, control in controls.items():
                        c_length, _ = control[n][case]
                        row[f"{name}_mean_acceptance_length"] = _round(c_length)
                        row[f"{name}_ratio"] = _round(length / c_length) if length and c_length else None
                    rows.append(row)
                    print(f"pause_acceptance {json.dumps(row)}", flush=True)
        finally:
            pool.release(reference)
    return {
        "k": k,
        "pauses": pauses,
        "max_tokens": max_tokens,
        "tolerance": TOLERANCE,
        "rows": rows,
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }


async def _paused_engine_runs(
    pool: EnginePool,
    base_env: dict[str, str],
    draft: str,
    k: int,
    hook: str | None,
    pauses: list[int],
    max_tokens: int,
) -> dict[int, dict[str, Any]]:
    """The paused runs on an engine of their own, booted under the seam's test hook ``hook`` (None:
    the skip as it ships)."""
    if hook is not None:
        os.environ[TEST_ENV] = hook  # read by the engine core the boot starts
    try:
        engine = await pool.boot(load_settings(_env(base_env, draft, k, paused=True)))
    finally:
        os.environ.pop(TEST_ENV, None)
    try:
        return await _paused_runs(engine, pauses, max_tokens)
    finally:
        pool.release(engine)


def _first_tokens(engine: Any, text: str, num_tokens: int) -> str:
    """The first ``num_tokens`` tokens of ``text`` (the paused request's output, decoded while the
    draft was off), re-encoded by the model's tokenizer: the reference continues from there."""
    tokenizer = engine.llm.get_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    return str(tokenizer.decode(ids[:num_tokens]))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.tools.bench.pause_acceptance", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--drafts", default="tiny:target,tiny:noisy", help="comma-separated SPECULATIVE_MODEL values")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--pauses", default="8,32,128")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-catch-up", action="store_true", help="add the negative control (catch-up off)")
    parser.add_argument("--lossless-samples", type=int, default=0, help="also the lossless test, on the first draft")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.lossless_samples:
        lossless = asyncio.run(
            bench_pause_lossless(
                dict(os.environ), draft=args.drafts.split(",")[0], k=args.k, num_samples=args.lossless_samples
            )
        )
        (args.out / "pause-lossless.json").write_text(json.dumps(lossless, indent=1) + "\n")
        print(f"pause_lossless {json.dumps({key: lossless[key] for key in ('control', 'paused')})}", flush=True)
    result = asyncio.run(
        bench_pause_acceptance(
            dict(os.environ),
            drafts=args.drafts.split(","),
            k=args.k,
            pauses=[int(x) for x in args.pauses.split(",")],
            max_tokens=args.max_tokens,
            no_catch_up=args.no_catch_up,
        )
    )
    (args.out / "pause-acceptance.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"pause_acceptance all_within_tolerance={result['all_within_tolerance']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
