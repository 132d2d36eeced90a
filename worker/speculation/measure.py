"""What ``SPECULATION_CONTROL=auto`` measures (:mod:`worker.speculation.controller` has the controller): the
acceptance of each draft position, and how long steps take against the cost model. Plain Python,
no vLLM: the scheduler hooks feed it (:mod:`worker.speculation.stats.control`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from worker.speculation.cost import StepCost, step_ms

__all__ = ["Acceptance", "StepTimes", "batch_bucket", "geometric_rate", "geometric_table"]

# Evidence halves every this many steps, so that a change of acceptance shows within a few hundred.
HALF_LIFE_STEPS = 64
# Before any evidence, each position is assumed accepted this often (so that drafting starts, and
# measures); a position with little evidence leans on the one before it with this many pseudo-trials.
PRIOR_RATE = 0.7
PRIOR_TRIALS = 2.0
# Step times: a cell's evidence halves every this many steps of its own k, and every this many steps
# of its batch size's other k values (so that a k not run fades to its prior, and one measured dear
# once, as in a warm-up, is tried again, seldom); a cell counts as this many steps of its prior.
STEP_TIME_HALF_LIFE_STEPS = 32
STEP_TIME_STALE_HALF_LIFE_STEPS = 512
STEP_TIME_PRIOR_STEPS = 2.0
# A scale is never read below this (a run of zero-length intervals).
MIN_STEP_SCALE = 0.1


class Acceptance:
    """Conditional acceptance per draft position, from the (drafted, accepted) pairs of each step,
    with exponentially decaying weights. Position ``i`` (1-based) is tried when at least ``i``
    drafts were verified and the ``i - 1`` before it were accepted; it succeeds when accepted."""

    def __init__(self, num_positions: int, *, half_life_steps: float = HALF_LIFE_STEPS) -> None:
        self.num_positions = num_positions
        self.decay = 0.5 ** (1 / half_life_steps)
        self.trials = [0.0] * num_positions
        self.successes = [0.0] * num_positions

    def age(self) -> None:
        """One step of evidence passed."""
        decay = self.decay
        self.trials = [t * decay for t in self.trials]
        self.successes = [s * decay for s in self.successes]

    def observe(self, pairs: Mapping[tuple[int, int], int]) -> None:
        """``(drafted, accepted) -> number of sequences`` of one step (pairs with no drafts ignored)."""
        trials, successes = self.trials, self.successes
        for (drafted, accepted), count in pairs.items():
            for i in range(min(drafted, accepted + 1, self.num_positions)):
                trials[i] += count
            for i in range(min(accepted, self.num_positions)):
                successes[i] += count

    def rates(self) -> list[float]:
        rates, previous = [], PRIOR_RATE
        for trials, successes in zip(self.trials, self.successes, strict=True):
            previous = (successes + PRIOR_TRIALS * previous) / (trials + PRIOR_TRIALS)
            rates.append(previous)
        return rates


class StepTimes:
    """How long steps take against the cost model, by the k whose drafts a step's time holds and its
    batch size (up to a power of two: 33-64, 65-128, ...): per cell, the decaying sums of the steps'
    measured and modelled milliseconds, whose ratio scales the model's step time.

    The model's figures are one host's: another host, a busier CPU or a driver can make the steps
    that verify drafts dearer than they were there, and not the ones without, which moves the
    break-even the model alone puts k at (docs/speculation.md, "How auto runs"). Sums, not a mean of
    each step's ratio: the engine's outputs come unevenly (a short interval after a long one), and
    only their sum is the time the steps took (a mean of logs misread verifying steps). A cell with
    little evidence leans on its prior: for k > 0, the other k > 0 measured at its batch size, by
    their weight (the host's cost of verifying, so that one k measured dear does not send the choice
    to another never measured), leaning on k = 0's scale (a host slow at every step); for k = 0, the
    model's figures, so that a host measured dear at verifying tries k = 0 and measures it."""

    def __init__(
        self,
        *,
        half_life_steps: float = STEP_TIME_HALF_LIFE_STEPS,
        stale_half_life_steps: float = STEP_TIME_STALE_HALF_LIFE_STEPS,
        drafts_after_output: bool = False,
    ) -> None:
        self.decay = 0.5 ** (1 / half_life_steps)
        self.stale_decay = 0.5 ** (1 / stale_half_life_steps)
        # batch bucket -> k -> [weight, measured ms, modelled ms]
        self.buckets: dict[int, dict[int, list[float]]] = {}
        self.drafts_after_output = drafts_after_output
        self._before: tuple[int, bool] | None = None  # the step before: (k it drafted, whether a decode step)
        self._pending: tuple[int, int, float, float] | None = None  # the step before's, filed unless one joins

    def observe(
        self, cost: StepCost, *, step: tuple[int, int, int, int], since: float | None, now: float, joined: int = 0
    ) -> None:
        """One step's outcome at ``now`` (seconds): its ``(sequences, k drafted, drafts verified,
        tokens the target ran)``, its time running from ``since`` (None: unknown), ``joined`` requests
        new in it. Which k its time is filed under, and which steps are left out:

        - the engine drafts after its outcome (vLLM's V2 runner: its output is copied once sampled,
          before the proposer runs): the time holds the step before's drafting, so the step before's
          k; V1 drafts before its outcome, the step's own;
        - a step with more than one prompt token per sequence besides its decode tokens (a prompt's
          chunk costs what the model does not price), and on V2 the step after it (its drafting);
        - a step that a request joins, and the step before it: with async scheduling the host
          prepares a step, with its new requests, before it takes in the outcome of the one before,
          which held that interval at about twice a decode step's (docs/speculation.md). What a join
          costs comes with the arrivals, not with k, so a step's time waits one step to be filed."""
        batch_size, k, verified, tokens = step
        is_decode = bool(batch_size) and tokens <= 2 * batch_size + verified
        counts = is_decode
        if self.drafts_after_output:
            before, self._before = self._before, (k, is_decode)
            counts = counts and before is not None and before[1]
            k = before[0] if before is not None else 0
        pending, self._pending = self._pending, None
        if pending is not None and not joined:
            self.add(batch_size=pending[0], k=pending[1], measured_ms=pending[2], model_ms=pending[3])
        if counts and since is not None and not joined:
            model = step_ms(cost, batch_size=batch_size, k=k, num_verified=verified, num_tokens=tokens)
            self._pending = (batch_size, k, (now - since) * 1000, model)

    def add(self, *, batch_size: int, k: int, measured_ms: float, model_ms: float) -> None:
        """One step's time and the model's for it."""
        if measured_ms < 0 or model_ms <= 0:
            return
        cells = self.buckets.setdefault(batch_bucket(batch_size), {})
        stale = self.stale_decay
        for other, cell in cells.items():
            if other != k:
                cell[0] *= stale
                cell[1] *= stale
                cell[2] *= stale
        cell = cells.setdefault(k, [0.0, 0.0, 0.0])
        decay = self.decay
        cell[0] = cell[0] * decay + 1.0
        cell[1] = cell[1] * decay + measured_ms
        cell[2] = cell[2] * decay + model_ms

    def scales(self, batch_size: int, num_spec_tokens: int) -> list[float]:
        """By k (0..num_spec_tokens), the scale on the model's step time at this batch size."""
        cells = self.buckets.get(batch_bucket(batch_size), {})
        ratios = {k: (w, measured / model) for k, (w, measured, model) in cells.items() if model > 0}
        prior_steps = STEP_TIME_PRIOR_STEPS

        def blend(w: float, ratio: float, prior: float) -> float:
            return (w * ratio + prior_steps * prior) / (w + prior_steps)

        zero = blend(*ratios.get(0, (0.0, 1.0)), 1.0)  # k = 0 leans on the model's figures
        scales = [max(MIN_STEP_SCALE, zero)]
        for k in range(1, num_spec_tokens + 1):
            # Its prior: the other k > 0 measured here, by their weight, leaning on k = 0's scale.
            others = [(w, r) for other, (w, r) in ratios.items() if other > 0 and other != k]
            weight = sum(w for w, _ in others)
            pooled = sum(w * r for w, r in others) / weight if weight else zero
            scales.append(max(MIN_STEP_SCALE, blend(*ratios.get(k, (0.0, 1.0)), blend(weight, pooled, zero))))
        return scales


def batch_bucket(batch_size: int) -> int:
    """The batch sizes :class:`StepTimes` files together: 1, 2, 3-4, ..., 33-64, 65-128, ..."""
    return (batch_size - 1).bit_length()


def geometric_rate(mean_accepted: float, k: int, *, table: Sequence[float] | None = None) -> float:
    """The per-position rate a whose geometric model accepts ``mean_accepted`` drafts per step of
    ``k``: ``a + a^2 + ... + a^k``. ``table``: :func:`geometric_table` for k (a bisection in C)."""
    table = table if table is not None else geometric_table(k)
    index = bisect.bisect_left(table, mean_accepted)
    return min(index, len(table) - 1) / (len(table) - 1)


def geometric_table(k: int, steps: int = 200) -> list[float]:
    """``a + a^2 + ... + a^k`` for ``a`` in ``steps`` steps from 0 to 1 (:func:`geometric_rate`)."""
    return [sum((i / steps) ** p for p in range(1, k + 1)) for i in range(steps + 1)]
