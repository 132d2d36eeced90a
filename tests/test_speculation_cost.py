"""The step-cost model (worker/speculation/cost.py): pure arithmetic, on the H200 figures."""

from __future__ import annotations

import pytest

from worker.speculation.cost import (
    STEP_COSTS,
    StepCost,
    best_k,
    break_even_length,
    expected_tokens,
    steady_factors,
    step_ms,
    tokens_per_ms,
)

DRAFT = STEP_COSTS["draft_model"]
NGRAM = STEP_COSTS["ngram"]
NGRAM_SYNC = STEP_COSTS["ngram_sync"]
EAGLE = STEP_COSTS["eagle"]
ALL_KS = range(5)


def test_expected_tokens_counts_the_targets_token_and_each_draft_reached() -> None:
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    assert expected_tokens([1.0, 1.0, 1.0], 3) == 4.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.0, 1.0], 2) == 1.0  # nothing past a rejected position


def test_the_figures_reproduce_the_points_they_were_read_from() -> None:
    # 1B-shaped draft, k = 4, 0% acceptance, one stream: 0.36x no speculation.
    no_spec = 1 / step_ms(StepCost(4.85, 0, 0, 512, 0, 0, 0, False), batch_size=1, k=0)
    assert tokens_per_ms(DRAFT, batch_size=1, k=4, rates=[0.0] * 4) / no_spec == pytest.approx(0.36, abs=0.02)
    # n-gram without async scheduling: the fourth map's steps without speculation (ms at 1 / 8 / 64
    # / 256 streams), and k = 4 with every draft accepted at one stream (3.50x, real acceptance).
    for batch, ms in ((1, 4.84), (8, 4.92), (64, 5.85), (256, 10.46)):
        assert step_ms(NGRAM_SYNC, batch_size=batch, k=0) == pytest.approx(ms, rel=0.06)
    assert tokens_per_ms(NGRAM_SYNC, batch_size=1, k=4, rates=[1.0] * 4) / no_spec == pytest.approx(3.5, rel=0.06)
    # n-gram on V2 with async scheduling (the sixth map): k = 0 and static k = 2, by streams.
    for batch, k, ms in ((1, 0, 4.85), (64, 0, 6.10), (256, 0, 10.60), (1, 2, 5.03), (32, 2, 6.67), (128, 2, 13.57)):
        assert step_ms(NGRAM, batch_size=batch, k=k) == pytest.approx(ms, rel=0.06)
    # The same figures predicted the seventh map's auto step at 256 streams, k = 1, before it ran: 18.72 ms.
    assert step_ms(NGRAM, batch_size=256, k=1) == pytest.approx(18.72, rel=0.05)
    # An EAGLE-3 head on V2 (the ninth and tenth maps): held at k = 0 (one head pass), k = 2 and k = 4.
    for batch, k, ms in ((1, 0, 5.45), (128, 0, 8.03), (1, 2, 6.28), (64, 2, 9.83), (128, 2, 15.36), (32, 4, 9.25)):
        assert step_ms(EAGLE, batch_size=batch, k=k) == pytest.approx(ms, rel=0.11)


def test_a_draft_model_pays_its_kv_sync_pass_at_k_zero_and_ngram_pays_nothing() -> None:
    one_pass = DRAFT.draft_pass_ms + DRAFT.draft_per_seq_ms
    assert step_ms(DRAFT, batch_size=1, k=0) == pytest.approx(DRAFT.base_ms + one_pass)
    assert step_ms(NGRAM, batch_size=1, k=0) == NGRAM.base_ms
    # An EAGLE head runs one pass at k = 0 as well: what kept auto at 0% acceptance at 0.90-0.93x.
    one_head_pass = EAGLE.draft_pass_ms + EAGLE.draft_per_seq_ms
    assert step_ms(EAGLE, batch_size=1, k=0) == pytest.approx(EAGLE.base_ms + one_head_pass)


def test_step_time_grows_with_tokens_past_the_knee() -> None:
    below = step_ms(NGRAM, batch_size=64, k=4)  # 320 tokens: under the knee
    above = step_ms(NGRAM, batch_size=256, k=4)  # 1,280 tokens
    assert above - step_ms(NGRAM, batch_size=256, k=0) > below - step_ms(NGRAM, batch_size=64, k=0)


@pytest.mark.parametrize("cost", [DRAFT, NGRAM, NGRAM_SYNC, EAGLE], ids=["draft_model", "ngram", "ngram_sync", "eagle"])
def test_best_k_follows_acceptance_and_load(cost: StepCost) -> None:
    good, bad = [0.9] * 4, [0.0] * 4
    assert best_k(cost, batch_size=1, rates=good, allowed_ks=ALL_KS) == 4
    assert best_k(cost, batch_size=1, rates=bad, allowed_ks=ALL_KS) == 0
    # Compute-bound at 256 streams: verification is no longer free, so k shrinks.
    assert best_k(cost, batch_size=256, rates=[0.8] * 4, allowed_ks=ALL_KS) < best_k(
        cost, batch_size=1, rates=[0.8] * 4, allowed_ks=ALL_KS
    )
    # Only what the engine can run.
    assert best_k(cost, batch_size=1, rates=good, allowed_ks=[0, 2]) == 2


def test_the_eagle_figures_choose_the_k_the_map_measured_best() -> None:
    # Acceptance length 3.0 at k = 4 (per position 1, 1, 0, 0): static k = 2 ran 2.31x / 2.21x / 2.04x /
    # 1.85x no speculation at 1 / 8 / 32 / 64 streams, k = 4 2.02x / 1.90x / 1.77x / 1.44x.
    for batch in (1, 8, 32, 64):
        assert best_k(EAGLE, batch_size=batch, rates=[1.0, 1.0, 0.0, 0.0], allowed_ks=ALL_KS) == 2


def acceptance_length(rate: float, k: int) -> float:
    """``1 + rate + ... + rate^k``: what a step of k drafts yields at a geometric ``rate``."""
    return expected_tokens([rate] * k, k)


def lived(rate: float, k: int = 4) -> tuple[float, float]:
    """A request that ran at k throughout: its rate, and its tokens per step so far (L(k))."""
    return rate, acceptance_length(rate, k)


# The H200 mixed map at k = 4: classes at rates 1, 0.6 and 0 held in proportion to their lifetimes
# (128 tokens at acceptance lengths 5, 2.31 and 1: 12.2% / 26.5% / 61.2%).
MIXED_AT_K4 = [lived(1.0)] * 122 + [lived(0.6)] * 265 + [lived(0.0)] * 612


def harmonic(k: int, rates: tuple[float, ...] = (1.0, 0.6, 0.0)) -> float:
    """What a slot yields a step at k in a steady state: the harmonic mean over the arrivals."""
    return len(rates) / sum(1 / acceptance_length(rate, k) for rate in rates)


def steady(batch: list[tuple[float, float]]) -> list[float]:
    factors = steady_factors(batch, 4)
    now = [sum(acceptance_length(rate, k) for rate, _ in batch) / len(batch) for k in range(5)]
    return [f * m for f, m in zip(factors, now, strict=True)]


def test_steady_factors_give_the_harmonic_mean_of_a_mixed_batch_and_one_for_a_uniform_batch() -> None:
    batch = MIXED_AT_K4
    assert steady(batch) == pytest.approx([harmonic(k) for k in range(5)], rel=2e-3)  # each arrival once
    assert steady(batch)[4] == pytest.approx(1.84, abs=0.01) and steady(batch)[2] == pytest.approx(1.63, abs=0.01)
    factors = steady_factors(batch, 4)
    assert factors[0] == factors[4] == pytest.approx(1.0, rel=2e-3)  # k = 0, and the k the batch ran at
    assert factors[2] > 1.05  # a lower k keeps the rate-1 class longer: more than the batch shows now
    assert steady_factors([lived(0.6)] * 50, 4) == pytest.approx([1.0] * 5)
    assert steady_factors([], 4) == [1.0] * 5


def test_a_batch_made_while_speculation_was_off_is_weighed_by_the_tokens_it_had() -> None:
    # Off (k = 0): every request lives 128 steps, so the batch holds the classes alike, and each has
    # had about one token a step whatever its rate (from the probes' rare drafts).
    batch = [(rate, 1.0) for rate in (1.0, 0.6, 0.0)] * 100
    assert steady(batch) == pytest.approx([harmonic(k) for k in range(5)], rel=2e-3)
    # Read as if each had run at k = 1 (its drafts per verify step), it would be put 8-20% too high.
    as_if_k1 = [lived(rate, 1) for rate, _ in batch]
    assert steady(as_if_k1)[4] > 1.15 * harmonic(4)


def test_best_k_weighs_each_k_by_its_factor() -> None:
    rates = [0.245, 0.76, 0.80, 0.85]  # the mixed batch's rates at 64 streams, as the controller read them
    assert best_k(NGRAM, batch_size=64, rates=rates, allowed_ks=ALL_KS) == 0
    factors = steady_factors(MIXED_AT_K4, 4)
    assert best_k(NGRAM, batch_size=64, rates=rates, allowed_ks=ALL_KS, factors=factors) in (1, 2)


@pytest.mark.parametrize(
    ("key", "batch_size", "k"), [("ngram", 1, 3), ("ngram", 64, 2), ("eagle", 8, 4), ("ngram_sync", 1, 1)]
)
def test_at_the_break_even_length_a_step_at_k_yields_what_one_without_drafting_does(
    key: str, batch_size: int, k: int
) -> None:
    """``break_even_length`` is the controller's comparison of k against 0 solved for the length:
    a uniform per-position rate giving that length makes the two equal, and a higher one wins."""
    cost = STEP_COSTS[key]
    length = break_even_length(cost, batch_size=batch_size, k=k)
    assert length > 1.0

    def rate_for(target: float) -> float:
        low, high = 0.0, 1.0
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if expected_tokens([mid] * k, k) < target else (low, mid)
        return low

    off = tokens_per_ms(cost, batch_size=batch_size, k=0, rates=[])
    at = tokens_per_ms(cost, batch_size=batch_size, k=k, rates=[rate_for(length)] * k)
    assert at == pytest.approx(off, rel=1e-9)
    rates = [rate_for(length + 0.1)] * k
    assert tokens_per_ms(cost, batch_size=batch_size, k=k, rates=rates) > off
    assert best_k(cost, batch_size=batch_size, rates=rates, allowed_ks=[0, k]) == k
