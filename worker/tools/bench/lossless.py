"""Is speculative decoding lossless at temperature > 0? Sampled tokens with and without speculation,
compared position by position, with an A/A control.

With rejection sampling the tokens a speculating engine emits follow the target's distribution
exactly, whatever the draft. This part samples ``num_samples`` completions of ``num_positions``
tokens from one prompt on an engine without speculation (twice: A and A', independent seeds) and on
each speculating configuration (X), straight through vLLM's ``AsyncLLM`` (the worker refuses
sampling where it knows the engine is lossy: this measures the engine itself), and reports:

- per position, the total-variation distance between the marginal distributions of the sampled
  token, A against A' (the control) and A against X;
- the threshold a distance must pass to count as a difference: the 99.9th percentile of the same
  distance between two samples of size ``num_samples`` drawn from the pooled A and A' samples
  (a parametric bootstrap of the null hypothesis "same distribution", 400 draws). With 8 positions
  tested, a lossless engine exceeds it at some position with probability about 8 x 0.1% < 1%;
  the control shows that the threshold is not too tight for this sample size;
- the share of sampled tokens the target itself gives a log-probability below -6 (scored by the
  non-speculating engine on prompt plus completion): the cheap guard, about 0 for a faithful
  sampler at temperature 1 on the tiny model, a third and more for vLLM's CPU build with a draft.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

from worker.config import Settings, load_settings
from worker.tools.bench.engines import EnginePool
from worker.tools.bench.spec_map_config import config_env

__all__ = ["bench_lossless", "bootstrap_threshold", "compare_samples", "total_variation"]

PROMPT = "Once upon a time"
LOW_LOGPROB = -6.0
BOOTSTRAP_DRAWS = 400
BOOTSTRAP_QUANTILE = 0.999


def total_variation(a: list[int], b: list[int]) -> float:
    """Total-variation distance between the empirical distributions of two samples."""
    count_a, count_b = Counter(a), Counter(b)
    return 0.5 * sum(abs(count_a[t] / len(a) - count_b[t] / len(b)) for t in count_a.keys() | count_b.keys())


def bootstrap_threshold(pooled: list[int], size: int, *, rng: random.Random) -> float:
    """The BOOTSTRAP_QUANTILE of the distance between two samples of ``size`` drawn from ``pooled``."""
    distances = sorted(
        total_variation(rng.choices(pooled, k=size), rng.choices(pooled, k=size)) for _ in range(BOOTSTRAP_DRAWS)
    )
    return distances[min(len(distances) - 1, int(BOOTSTRAP_QUANTILE * len(distances)))]


async def _sample(
    engine: Any, *, num_samples: int, num_positions: int, sampling: dict[str, Any], seed0: int
) -> list[list[int]]:
    """``num_samples`` completions' token ids, each request with its own seed, all at once."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    prompt = TokensPrompt(prompt_token_ids=_prompt_ids(engine))

    async def one(i: int) -> list[int]:
        params = SamplingParams(
            max_tokens=num_positions,
            ignore_eos=True,
            seed=seed0 + i,
            output_kind=RequestOutputKind.FINAL_ONLY,
            **sampling,
        )
        tokens: list[int] = []
        async for out in engine.llm.generate(prompt, params, f"lossless-{seed0}-{i}-{time.time_ns()}"):
            tokens = list(out.outputs[0].token_ids)
        return tokens

    return list(await asyncio.gather(*(one(i) for i in range(num_samples))))


async def _low_logprob_share(engine: Any, samples: list[list[int]]) -> float:
    """Share of sampled tokens (after the first, which no draft proposes) that the target scores below
    LOW_LOGPROB: prompt plus completion scored with ``prompt_logprobs`` by a non-speculating engine."""
    from vllm import SamplingParams, TokensPrompt

    prompt_ids = _prompt_ids(engine)
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)

    async def score(i: int, completion: list[int]) -> list[float]:
        ids = prompt_ids + completion
        result = None
        async for out in engine.llm.generate(TokensPrompt(prompt_token_ids=ids), params, f"score-{i}-{time.time_ns()}"):
            result = out
        assert result is not None and result.prompt_logprobs is not None
        scored = result.prompt_logprobs[len(prompt_ids) + 1 :]  # completion tokens after the first
        return [entry[token].logprob for entry, token in zip(scored, completion[1:], strict=True)]

    logprobs = [lp for values in await asyncio.gather(*(score(i, c) for i, c in enumerate(samples))) for lp in values]
    return sum(1 for lp in logprobs if lp < LOW_LOGPROB) / len(logprobs) if logprobs else 0.0


def _prompt_ids(engine: Any) -> list[int]:
    return list(engine.llm.get_tokenizer().encode(PROMPT))


def compare_samples(reference: list[list[int]], other: list[list[int]], thresholds: list[float]) -> dict[str, Any]:
    distances = [total_variation([s[j] for s in reference], [s[j] for s in other]) for j in range(len(thresholds))]
    return {
        "tv_per_position": [round(d, 4) for d in distances],
        "max_tv": round(max(distances), 4),
        "positions_over_threshold": [
            j + 1 for j, (d, t) in enumerate(zip(distances, thresholds, strict=True)) if d > t
        ],
    }


async def bench_lossless(
    env: dict[str, str],
    *,
    configs: dict[str, dict[str, str]],
    sampling: dict[str, Any],
    num_samples: int = 500,
    num_positions: int = 8,
    pool: EnginePool | None = None,
) -> dict[str, Any]:
    """``configs``: name -> the speculative settings (environment variables) of each X."""
    pool = pool or EnginePool(share=False)
    rng = random.Random(1234)
    base: Settings = load_settings(config_env(env, "none"))  # whatever speculation the environment sets, none
    plain = await pool.get(base)
    args: dict[str, Any] = {"num_samples": num_samples, "num_positions": num_positions, "sampling": sampling}
    try:
        a = await _sample(plain, **args, seed0=0)
        a2 = await _sample(plain, **args, seed0=10**6)
        thresholds = [bootstrap_threshold([s[j] for s in a + a2], num_samples, rng=rng) for j in range(num_positions)]
        control = compare_samples(a, a2, thresholds)
        control["low_logprob_share"] = round(await _low_logprob_share(plain, a), 4)
        rows = []
        for name, spec_env in configs.items():
            point_env = {k: v for k, v in env.items() if not k.startswith("SPECULATIVE_")}
            engine = await pool.get(load_settings({**point_env, **spec_env}))
            try:
                x = await _sample(engine, **args, seed0=2 * 10**6)
            finally:
                pool.release(engine)
            row = {"config": name, "env": spec_env, **compare_samples(a, x, thresholds)}
            row["low_logprob_share"] = round(await _low_logprob_share(plain, x), 4)
            row["lossless"] = not row["positions_over_threshold"]
            rows.append(row)
    finally:
        pool.release(plain)
    return {
        "prompt": PROMPT,
        "sampling": sampling,
        "num_samples": num_samples,
        "num_positions": num_positions,
        "thresholds": [round(t, 4) for t in thresholds],
        "bootstrap": {"draws": BOOTSTRAP_DRAWS, "quantile": BOOTSTRAP_QUANTILE},
        "control": {**control, "passes": not control["positions_over_threshold"]},
        "rows": rows,
    }
