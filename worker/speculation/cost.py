"""The cost of a speculative decode step: a pure model, from which the controller picks k.

A step of ``b`` sequences that each verify ``k`` drafts runs the target on ``b * (k + 1)`` tokens,
and the drafter: a draft model one pass per drafted position (vLLM 0.32 runs its first pass even at
``k = 0``, so that the draft's KV cache stays in step with the target's), n-gram matching on the CPU.
What a step yields per sequence is ``1 + sum_i prod_{m <= i} p_m`` tokens for the conditional
acceptance ``p_i`` of each draft position, scaled, where the requests accept differently, by what
k does to the batch's make-up over time (:func:`steady_factors`). The best k maximises tokens per
millisecond.

Parameters are per GPU, model and drafter (:data:`STEP_COSTS`), for an 8B bf16 target on one H200:

- n-gram: fitted (least squares) to the engine steps of the H200 map (``python -m worker bench
  --parts spec_map``, synthetic acceptance): ``ngram`` to vLLM's V2 runner drafting on the GPU with
  async scheduling (``ngram_gpu``, what ``auto`` runs on a GPU), ``ngram_sync`` to vLLM running the
  CPU proposer's name without async scheduling (V1, or V2 under the name ``ngram``);
- an EAGLE head (``eagle``): fitted the same way to the map's EAGLE-3 runs on V2. The head makes one
  pass per drafted position and, like a draft model, one at ``k = 0``;
- a draft model: provisional, read off the single-stream points and a roofline for the compute
  knee. vLLM 0.32 runs such a draft's passes without full CUDA graphs, so that its cost is host
  time (the draft-step run). ``draft_model_skip``: the same draft where the worker skips its pass
  at k = 0 (``worker.vllm_internals.draft_skip``): k = 0 costs the target alone, and the step that
  resumes drafting pays a catch-up prefill of the tokens decoded while off
  (``catch_up_per_token_ms``, provisional: a 1B draft's prefill FLOPs per token on an H100).

Each constant's runs are beside it; how well the fits hold: docs/speculation.md, "How auto runs".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

__all__ = [
    "STEP_COSTS",
    "StepCost",
    "best_k",
    "break_even_length",
    "expected_tokens",
    "steady_factors",
    "step_ms",
    "tokens_per_ms",
]


@dataclasses.dataclass(frozen=True, slots=True)
class StepCost:
    """Milliseconds of one engine step. The target: ``base_ms`` plus ``per_seq_ms`` for each
    sequence beyond the first, plus ``per_token_ms`` for each token beyond ``knee_tokens`` (below
    the knee the step reads the weights once whatever it computes), plus ``verify_ms`` when
    verifying (the rejection sampler, the extra logits). The drafter: ``draft_pass_ms`` plus
    ``draft_per_seq_ms`` per sequence for each pass; a draft model makes ``max(k, 1)`` passes
    (``is_synced_at_zero``: its KV-sync pass at k = 0), n-gram none (its matching is in
    ``draft_per_seq_ms`` per drafted step). ``catch_up_per_token_ms``: where the drafter skips its
    pass at k = 0, what catching its KV up costs per token skipped, paid when drafting resumes (0:
    nothing to catch up)."""

    base_ms: float
    per_seq_ms: float
    per_token_ms: float
    knee_tokens: int
    verify_ms: float
    draft_pass_ms: float
    draft_per_seq_ms: float
    is_synced_at_zero: bool
    catch_up_per_token_ms: float = 0.0


# Provisional: read off the map's one stream at k = 4 and 0% acceptance (docs/benchmarks.md).
_DRAFT_MODEL = StepCost(
    base_ms=4.85,
    per_seq_ms=0.03,
    per_token_ms=0.025,
    knee_tokens=512,
    verify_ms=0.4,
    draft_pass_ms=2.0,
    draft_per_seq_ms=0.004,
    is_synced_at_zero=True,
)

# 8B bf16 target on one H200 (module docstring).
STEP_COSTS: dict[str, StepCost] = {
    "draft_model": _DRAFT_MODEL,
    # The draft above, its pass at k = 0 skipped: ~2.4 GFLOP a token for a 1B draft at ~400 TFLOPS.
    "draft_model_skip": dataclasses.replace(_DRAFT_MODEL, is_synced_at_zero=False, catch_up_per_token_ms=0.006),
    # Fitted to the sixth run's V2 steps at k = 0 (1-256 streams), static k = 2 (1-128) and auto
    # (k = 2-3, 1-64); the steps: docs/benchmarks.md. Past ~400 tokens a step, 256 streams at k = 1
    # (512 tokens), the model extrapolates.
    "ngram": StepCost(
        base_ms=4.89,
        per_seq_ms=0.0185,
        per_token_ms=0.0073,
        knee_tokens=128,
        verify_ms=0.27,
        draft_pass_ms=0.0,
        draft_per_seq_ms=0.0106,
        is_synced_at_zero=False,
    ),
    # Fitted to the ninth and tenth runs' V2 steps within the largest CUDA graph: no speculation at
    # 1-256 streams, held at k = 0 (one head pass a step) at 1-256, k = 2 at 1-128, k = 4 at 1-64
    # (the steps: docs/benchmarks.md). verify_ms also carries the head's first pass over every
    # verified token, which the model has no term for. Under it the controller holds k = 2 at
    # acceptance [1, 1, 0, 0] up to 64 streams (the map's best there too), k = 1 from 128 on.
    "eagle": StepCost(
        base_ms=4.917,
        per_seq_ms=0.0204,
        per_token_ms=0.0334,
        knee_tokens=256,
        verify_ms=1.443,
        draft_pass_ms=0.2725,
        draft_per_seq_ms=0.0074,
        is_synced_at_zero=True,
    ),
    # Fitted to the fourth run's steps (no speculation at 1-256 streams; static k = 4 on V1 and auto
    # on V2 under "ngram" beside them): a step waits for the host. At k = 4 with every draft accepted
    # at one stream it predicts a little less speed-up than real acceptance gave (docs/benchmarks.md).
    "ngram_sync": StepCost(
        base_ms=4.78,
        per_seq_ms=0.0162,
        per_token_ms=0.013,
        knee_tokens=128,
        verify_ms=2.34,
        draft_pass_ms=0.0,
        draft_per_seq_ms=0.013,
        is_synced_at_zero=False,
    ),
}


def step_ms(
    cost: StepCost, *, batch_size: int, k: int, num_verified: int | None = None, num_tokens: int | None = None
) -> float:
    """One step of ``batch_size`` sequences drafting ``k`` tokens for the next step and verifying
    ``num_verified`` drafts in all (default ``batch_size * k``: every sequence verifies k), the target
    running ``num_tokens`` tokens (default one per sequence and each verified draft; more where a
    prompt's chunk shares the step)."""
    verified = batch_size * k if num_verified is None else num_verified
    tokens = batch_size + verified if num_tokens is None else num_tokens
    target = cost.base_ms + cost.per_seq_ms * (batch_size - 1) + cost.per_token_ms * max(0, tokens - cost.knee_tokens)
    if verified:
        target += cost.verify_ms
    passes = max(k, 1) if cost.is_synced_at_zero else k
    draft = passes * (cost.draft_pass_ms + cost.draft_per_seq_ms * batch_size)
    if not cost.draft_pass_ms and k:  # n-gram: its matching, once a drafted step
        draft += cost.draft_per_seq_ms * batch_size
    return target + draft


def break_even_length(cost: StepCost, *, batch_size: int, k: int) -> float:
    """The mean acceptance length (tokens a sequence yields per step) at which steps drafting ``k``
    tokens yield as many tokens per millisecond as steps without drafting: below it, speculation at
    k costs more than it saves. The controller's comparison of k against 0 (:func:`tokens_per_ms`),
    solved for the acceptance; the acceptance watchdog's alert is read against it
    (docs/speculation.md, "The watchdog and the controller")."""
    return step_ms(cost, batch_size=batch_size, k=k) / step_ms(cost, batch_size=batch_size, k=0)


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """Tokens a sequence yields in a step verifying ``k`` drafts: the target's own token, plus
    each draft position ``i`` reached and accepted (``rates[i]``: accepted given the ones before it)."""
    total, reach = 1.0, 1.0
    for rate in rates[:k]:
        reach *= rate
        total += reach
    return total


def tokens_per_ms(
    cost: StepCost,
    *,
    batch_size: int,
    k: int,
    rates: Sequence[float],
    factors: Sequence[float] | None = None,
    scales: Sequence[float] | None = None,
) -> float:
    """Tokens per millisecond of a step at ``k`` (``factors``: :func:`steady_factors`, by k;
    ``scales``: by k, the step's measured time over the model's, where measured)."""
    factor = factors[k] if factors is not None else 1.0
    scale = scales[k] if scales is not None else 1.0
    return batch_size * expected_tokens(rates, k) * factor / (step_ms(cost, batch_size=batch_size, k=k) * scale)


def best_k(
    cost: StepCost,
    *,
    batch_size: int,
    rates: Sequence[float],
    allowed_ks: Iterable[int],
    factors: Sequence[float] | None = None,
    scales: Sequence[float] | None = None,
) -> int:
    """The k among ``allowed_ks`` with the most tokens per millisecond (ties: the smaller k)."""
    best, best_rate = 0, -1.0
    for k in sorted(allowed_ks):
        rate = tokens_per_ms(cost, batch_size=batch_size, k=k, rates=rates, factors=factors, scales=scales)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best


def steady_factors(requests: Sequence[tuple[float, float]], num_spec_tokens: int) -> list[float]:
    """By k (0..num_spec_tokens), what the batch yields per sequence once it runs at k for a while,
    over what it yields at k as it is now: ``requests`` are the batch's ``(rate, tokens per step so
    far)``, each request's own geometric acceptance and the tokens it has had per engine step.

    A request of ``n`` tokens stays ``n / L(k)`` steps in the batch at acceptance length ``L(k)``, so a
    batch whose streams start a new request as one ends holds each kind of request in proportion to
    its lifetime: the ones that accept least the longest. What each slot yields a step is then the
    harmonic mean of the requests' ``L(k)`` over the requests as they arrive, not their mean over the
    batch of the moment, and it moves with k: a lower k keeps the requests that accept every draft in
    the batch longer. The batch now holds each request in proportion to the steps it has taken per
    token, so a request weighs its tokens per step so far, ``L_now``, among the arrivals: the steady
    yield at k is ``sum(L_now) / sum(L_now / L(k))``, which matched the mixed map's measured yields
    where the batch's rates of the moment did not (docs/speculation.md, "How auto runs"). Written
    here: vLLM's scheduler has no model of what k does to the batch's make-up. All factors are 1
    when every request accepts alike."""
    factors = [1.0] * (num_spec_tokens + 1)
    if not requests:
        return factors
    # By request, L(0..num_spec_tokens) in one pass each: expected_tokens([rate] * k, k) for every k at
    # once (the review runs this over up to 256 requests).
    lengths = []
    for rate, _ in requests:
        row, reach = [1.0], 1.0
        for _ in range(num_spec_tokens):
            reach *= rate
            row.append(row[-1] + reach)
        lengths.append(row)
    now = [tokens_per_step for _, tokens_per_step in requests]
    total_now = sum(now)
    for k in range(1, num_spec_tokens + 1):
        steady = total_now / sum(n / row[k] for n, row in zip(now, lengths, strict=True))
        factors[k] = steady * len(lengths) / sum(row[k] for row in lengths)
    return factors
