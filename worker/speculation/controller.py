"""``SPECULATION_CONTROL=auto``: k chosen per engine step from the batch size and live acceptance.

vLLM 0.32 runs a speculation schedule by batch size (``num_speculative_tokens_per_batch_size``):
its scheduler reads the step's k from a dense table, ``Scheduler.dynamic_sd_lookup[batch_size]``,
and the model runner drafts that many tokens for the next step. vLLM runs a draft model's first
pass even at k = 0, to keep the draft's KV cache in step; on a GPU the worker skips that pass and
catches the cache up when drafting resumes (``worker.vllm_internals.draft_skip``), so after a
period without drafting the draft's KV cache is whole either way: the collapse TensorRT-LLM and
vLLM V0 once had on re-enabling does not happen here. Its probes pay that catch-up, and are
spaced for it (:meth:`SpeculationController.probe_every_at`). On the GPU the V1
runner then runs piecewise CUDA graphs (any k up to the configured one works); the V2 runner
captures full graphs only for the query lengths of the schedule's k values (k = 0 included only
where the schedule holds it), under vLLM's FULL mode (the worker's default for n-gram under
``auto`` on V2) one set for every mix of query lengths, steps with prompts included.

:class:`SpeculationController` replaces that table with an object that answers each lookup with
the k of most tokens per millisecond under the cost model (:mod:`worker.speculation.cost`), given the
acceptance the step outputs show, per draft position, what each k does over time to the make-up
of a batch whose requests accept differently (``steady_factors``, from the per-request review), and
how long this engine's steps take against the model's figures, by k and batch size (``StepTimes``
in :mod:`worker.speculation.measure`, with the acceptance):

- it never exceeds the configured schedule (``SPECULATIVE_TOKENS_BY_BATCH``) nor the configured k,
  and on V2 no k at a batch size past its largest full CUDA graph (``graph_batches``);
- below break-even it returns 0, and one step in ``probe_every`` it drafts the smallest k again
  (a probe), so that it notices when acceptance recovers; sooner once half the batch is new;
- per request, where a request's own acceptance is far below the batch's, it caps how many of
  that request's drafts are verified (the batch's drafting is capped too when every request is).
  Where the engine replays full CUDA graphs (V2, ``graph_batches``), a graph needs every request
  of the step at one query length, and a batch with a trimmed request runs piecewise, which cost
  more than the trimming saved (docs/speculation.md, "How auto runs"). There the review only lowers
  the batch's k, for every request alike, when every request is capped; no request is trimmed
  alone. Under FULL a trimmed batch would still replay a full graph: not measured, so not done.

Nothing here imports vLLM: the scheduler mixin (:mod:`worker.speculation.stats.control`) reads vLLM's objects
by the attributes the pinned version has, and the arithmetic is plain Python, tested on its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from worker.speculation.cost import StepCost, best_k, expected_tokens, steady_factors, step_ms
from worker.speculation.measure import Acceptance, StepTimes, geometric_rate, geometric_table

__all__ = [
    "PROBE_CATCH_UP_BUDGET",
    "PROBE_EVERY_MAX_STEPS",
    "PROBE_EVERY_STEPS",
    "REVIEW_EVERY_STEPS",
    "SpeculationController",
]

# A child of vLLM's logger: the controller runs in vLLM's engine-core process, where only vLLM's
# loggers have handlers.
log = logging.getLogger("vllm.worker.speculation.controller")

# Steps at k = 0 between probes: a probe at 0% acceptance costs one draft pass and one verified
# token per sequence, 1/32 of that per step.
PROBE_EVERY_STEPS = 32
# Where the drafter skips its pass at k = 0 (a draft model on V2: worker.vllm_internals.draft_skip), a
# probe first catches each sequence's draft KV up over the steps it was off: the share of the time off
# those catch-ups may take, and the longest interval between probes that keeps them within it.
PROBE_CATCH_UP_BUDGET = 0.01
PROBE_EVERY_MAX_STEPS = 1024
# Steps between reviews of each request's own acceptance (the per-request caps).
REVIEW_EVERY_STEPS = 64
# Sequences of a step whose outcome the controller reads (the batch's first ones).
SAMPLE_SEQUENCES = 64
# Steps with evidence between re-evaluations of the cost model per batch size.
RECHOOSE_EVERY_STEPS = 4
# A request is reviewed once it has verified this many steps.
MIN_REQUEST_STEPS = 8
# While off, the share of the batch new since the last probe that brings the next one forward, and the
# sequences such probes try at most in a row (at one stream, enough accepted drafts to turn it on).
JOINED_SHARE_PROBE = 0.5
PROBE_CHAIN_SEQUENCES = 16
# Reviewed requests the steady factors need (or every request of a smaller batch).
MIN_STEADY_REQUESTS = 8


class SpeculationController:
    """The k of each step (:meth:`choose`), learnt from each step's outcome (:meth:`observe`).

    ``schedule``: vLLM's dense table of the highest k per batch size (index = batch size), or None
    for ``num_spec_tokens`` at every size. ``allowed_ks``: the k values the engine can run (all of
    0..num_spec_tokens where the runner is not V2: the CPU build's). ``graph_batches``: by k
    (index), the most sequences a step can carry at that k and replay a full CUDA graph (V2), or
    None: a batch of ``b`` sequences then runs a k only where ``b`` is within it (0 always runs).
    ``calibrate``: each step's time, between one outcome and the next, scales the model's
    (:class:`StepTimes`). ``drafts_after_output``: the engine drafts after a step's outcome is out
    (vLLM's V2 runner: :meth:`StepTimes.observe`)."""

    def __init__(
        self,
        *,
        num_spec_tokens: int,
        cost: StepCost,
        schedule: Sequence[int] | None = None,
        allowed_ks: Iterable[int] | None = None,
        graph_batches: Sequence[int] | None = None,
        probe_every: int = PROBE_EVERY_STEPS,
        calibrate: bool = True,
        drafts_after_output: bool = False,
    ) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.cost = cost
        self.schedule = schedule
        self.graph_batches = graph_batches
        ks = range(num_spec_tokens + 1) if allowed_ks is None else allowed_ks
        self.allowed_ks = sorted({k for k in ks if 0 <= k <= num_spec_tokens} | {0})
        self.probe_every = probe_every
        self.acceptance = Acceptance(num_spec_tokens)
        self.draft_cap = num_spec_tokens  # lowered when every running request is capped
        self.caps: dict[str, int] = {}  # request id -> drafts verified at most
        self.factors = steady_factors([], num_spec_tokens)  # by k: the batch's steady yield over its yield now
        self.steps_by_k = [0] * (num_spec_tokens + 1)
        self.num_probes = 0
        self.time_off_s = 0.0
        self._off_streak = 0  # steps off since the last probe
        self._num_observed = 0  # steps with evidence
        self._is_off = False  # at k = 0 by acceptance, not by the schedule
        self._last_k: int | None = None
        self._last_time: float | None = None
        self._joined_share = 0.0  # of the batch, joined while off since the last probe
        self._probing = False  # probes brought forward by joins, while half their sequences accept
        self._probed = 0  # the sequences those probes tried
        self._choices: dict[tuple[int, int], tuple[int, int]] = {}  # (batch, top k) -> (k, probe k)
        self._tables = [geometric_table(k) for k in range(num_spec_tokens + 1)]  # by drafts per step
        # Measured step times against the model's (None: the model's figures alone).
        self.step_times = StepTimes(drafts_after_output=drafts_after_output) if calibrate else None
        self._last_batch = 1

    # vLLM's scheduler reads ``dynamic_sd_lookup[batch_size]``.
    def __getitem__(self, batch_size: int) -> int:
        return self.choose(batch_size)

    def highest_k(self, batch_size: int) -> int:
        schedule = self.schedule
        top = self.num_spec_tokens
        if schedule is not None:
            top = schedule[min(batch_size, len(schedule) - 1)]
        top = min(top, self.draft_cap)
        graphs = self.graph_batches
        if graphs is not None:
            top = min(top, len(graphs) - 1)
            while top > 0 and graphs[top] < batch_size:
                top -= 1
        return max(0, top)

    def choose(self, batch_size: int) -> int:
        top = self.highest_k(batch_size)
        key = (batch_size, top)
        choice = self._choices.get(key)
        if choice is None:
            ks = [x for x in self.allowed_ks if x <= top]
            best = self._best_k(batch_size, ks)
            probe_k = ks[1] if len(ks) > 1 else 0  # the smallest runnable k; 0 where none is allowed
            choice = (best, probe_k)
            self._choices[key] = choice
        k, probe_k = choice
        is_off = k == 0 and probe_k > 0  # off by acceptance, not by the schedule
        if is_off != self._is_off:
            self._is_off = is_off
            self._probing = False
            self._joined_share = 0.0
            log.info("speculation %s at batch %d: %s", "off" if is_off else "on", batch_size, self.report())
        if is_off:
            self._off_streak += 1
            if self._off_streak >= self.probe_every_at(batch_size):
                self._off_streak = 0
                self._joined_share = 0.0
                self.num_probes += 1
                k = probe_k
        else:
            self._off_streak = 0
        self.steps_by_k[k] += 1
        self._last_k = k
        return k

    def probe_every_at(self, batch_size: int) -> int:
        """Steps off between probes at ``batch_size``: ``probe_every``, or where a probe pays a
        catch-up (``cost.catch_up_per_token_ms``) more, so that catching up stays within
        :data:`PROBE_CATCH_UP_BUDGET` of the time off. Every step off leaves each sequence a token
        to catch up, so the catch-up's share of the time off is the same at any interval while the
        requests live; a longer one lets more of them end first, their tokens never caught up."""
        per_token = self.cost.catch_up_per_token_ms
        if not per_token:
            return self.probe_every
        share = batch_size * per_token / (PROBE_CATCH_UP_BUDGET * step_ms(self.cost, batch_size=batch_size, k=0))
        return min(PROBE_EVERY_MAX_STEPS, max(self.probe_every, round(self.probe_every * share)))

    def observe(
        self,
        pairs: Mapping[tuple[int, int], int],
        *,
        now: float | None = None,
        step: tuple[int, int, int, int] | None = None,
        scheduled_at: float | None = None,
        joined: int = 0,
    ) -> None:
        """One step's outcome: ``(drafted, accepted) -> sequences`` (empty: nothing was verified).
        ``step``: its ``(sequences, k drafted, drafts verified, tokens the target ran)``, whose time
        is the one since the outcome before (with async scheduling, the engine's period), or since it
        was scheduled where that came later (``scheduled_at``, given for a step scheduled on an idle
        engine); ``joined``: requests new in that step (:meth:`StepTimes.observe`)."""
        now = time.monotonic() if now is None else now
        self._observe_time(now, step=step, scheduled_at=scheduled_at, joined=joined)
        if joined and self._is_off:
            self._count_joined(joined, num_sequences=self._last_batch if step is None else step[0])
        if pairs and self._is_off:
            self._choices.clear()  # a probe's evidence: judged at once (off, few steps have any)
            if self._probing:
                self._follow_probe(pairs)
        if not pairs:
            return
        # Evidence ages with new evidence only: while off, what made the controller stop stays
        # until a probe says otherwise (aged by the clock, it would drift back to the prior).
        self.acceptance.age()
        self.acceptance.observe(pairs)
        # The choice per batch size is kept for RECHOOSE_EVERY_STEPS steps of evidence: the model's
        # arithmetic is most of the controller's time per step, and a few steps' evidence moves it little.
        self._num_observed += 1
        if self._num_observed % RECHOOSE_EVERY_STEPS == 0:
            self._choices.clear()

    def _observe_time(
        self, now: float, *, step: tuple[int, int, int, int] | None, scheduled_at: float | None, joined: int
    ) -> None:
        """The time at k = 0, and the step's time against the model's (:meth:`observe`)."""
        last = self._last_time
        if self._last_k == 0 and last is not None:
            self.time_off_s += now - last
        self._last_time = now
        if step is None or self.step_times is None:
            return
        since = last
        if last is not None and scheduled_at is not None:
            since = max(last, scheduled_at)  # scheduled on an idle engine: timed from then
        self.step_times.observe(self.cost, step=step, since=since, now=now, joined=joined)

    def _count_joined(self, joined: int, *, num_sequences: int) -> None:
        """While off, the batch's requests change: once half the batch is new since the last probe
        (on V2 a resumed request counts too), the next step chosen probes, and so on while half a
        probe's sequences accept (:meth:`_follow_probe`), so that a new request that accepts is not
        judged for ``probe_every`` steps by the ones before it. (With async scheduling vLLM chooses a
        step's k before the outcome of the step before is in: a probe follows its evidence by two.)"""
        self._joined_share += min(1.0, joined / max(1, num_sequences))
        # Not where probes are spaced out for their catch-up: the new requests' sequences would be
        # tried at the price of every old one's.
        if self._joined_share >= JOINED_SHARE_PROBE and self.probe_every_at(num_sequences) == self.probe_every:
            self._off_streak = self.probe_every - 1
            self._probing = True
            self._probed = 0

    def _follow_probe(self, pairs: Mapping[tuple[int, int], int]) -> None:
        """A probe brought forward: another follows while half its sequences accepted, up to
        ``PROBE_CHAIN_SEQUENCES`` sequences tried in a row."""
        tried = sum(pairs.values())
        self._probed += tried
        accepting = sum(n for (_, accepted), n in pairs.items() if accepted)
        self._probing = 2 * accepting >= tried and self._probed < PROBE_CHAIN_SEQUENCES
        if self._probing:
            self._off_streak = self.probe_every - 1

    def review(self, requests: Iterable[tuple[str, Sequence[int], int, int]], *, batch_size: int) -> None:
        """Each request's own acceptance, from its counts: ``(request id, histogram of accepted drafts
        per verify step, drafts verified, tokens so far)``. From them, what each k does to the batch's
        make-up over time (:func:`worker.speculation.cost.steady_factors`, which :meth:`choose` weighs each k
        by; all 1 while fewer than ``MIN_STEADY_REQUESTS`` requests, or not all of a smaller batch,
        have counts enough), and per-request caps: a request keeps ``cap`` drafts
        per step where its own geometric acceptance ``a`` has ``a^cap`` worth the verification of one
        token at this batch size (a marginal cost next to the batch's tokens per millisecond); at
        least one, so that it keeps measuring. With full CUDA graphs no request is capped alone
        (module docstring). The caps are judged afresh each review, from the k chosen without them."""
        fits: list[tuple[str, float, float]] = []  # (request id, geometric rate, tokens per step so far)
        num_requests = 0
        for rid, histogram, drafted, num_tokens in requests:
            num_requests += 1
            steps = sum(histogram)
            if steps < MIN_REQUEST_STEPS:
                continue
            accepted = sum(j * n for j, n in enumerate(histogram))
            # The drafts it verified per step (its k may have changed): the geometric model's k.
            width = min(self.num_spec_tokens, max(1, round(drafted / steps)))
            rate = geometric_rate(accepted / steps, width, table=self._tables[width])
            # Every step gave it one token besides those accepted, steps without drafts included (a
            # count short of its accepted drafts, as where vLLM starts a session's output afresh, is skipped).
            if num_tokens > accepted:
                fits.append((rid, rate, min(num_tokens / (num_tokens - accepted), 1.0 + width)))
        enough = bool(fits) and len(fits) >= min(MIN_STEADY_REQUESTS, num_requests)
        # Too few (as after a stretch at k = 0, where requests see a probe every PROBE_EVERY_STEPS
        # steps): each k judged by the batch as it is, not by a make-up the batch no longer has.
        self.factors = steady_factors([(r, now) for _, r, now in fits] if enough else [], self.num_spec_tokens)
        self.draft_cap = self.num_spec_tokens
        self._choices.clear()
        k = self.choose_quietly(batch_size)
        caps: dict[str, int] = {}
        if k > 1:
            cost, rates = self.cost, self.acceptance.rates()
            base = step_ms(cost, batch_size=batch_size, k=k)
            marginal = step_ms(cost, batch_size=batch_size, k=k, num_verified=batch_size * k + 1) - base
            threshold = marginal * batch_size * expected_tokens(rates, k) * self.factors[k] / base
            if threshold > 0:
                for rid, rate, _ in fits:
                    cap = 1
                    while cap < k and rate ** (cap + 1) >= threshold:
                        cap += 1
                    if cap < k:
                        caps[rid] = cap
        self.draft_cap = max(caps.values()) if caps and len(caps) == num_requests else self.num_spec_tokens
        # Full graphs (module docstring): the batch keeps one query length, the draft cap's.
        self.caps = caps if self.graph_batches is None else {}

    def choose_quietly(self, batch_size: int) -> int:
        """The k :meth:`choose` would pick, without counting a step or probing."""
        top = min(self.highest_k(batch_size), self.num_spec_tokens)
        return self._best_k(batch_size, [x for x in self.allowed_ks if x <= top])

    def _best_k(self, batch_size: int, ks: Sequence[int]) -> int:
        self._last_batch = batch_size
        times = self.step_times
        return best_k(
            self.cost,
            batch_size=batch_size,
            rates=self.acceptance.rates(),
            allowed_ks=ks,
            factors=self.factors,
            scales=times.scales(batch_size, self.num_spec_tokens) if times is not None else None,
        )

    def report(self) -> dict[str, Any]:
        """Steps by chosen k, probes, the seconds spent at k = 0, and the rest of what choices weigh
        (``step_scales``: by k, measured step time over the model's at the last batch size chosen for)."""
        times = self.step_times
        scales = times.scales(self._last_batch, self.num_spec_tokens) if times is not None else None
        return {
            "steps_by_k": list(self.steps_by_k),
            "num_probes": self.num_probes,
            "time_off_s": round(self.time_off_s, 3),
            "rates": [round(r, 3) for r in self.acceptance.rates()],
            "num_capped_requests": len(self.caps),
            "draft_cap": self.draft_cap,
            "factors": [round(f, 3) for f in self.factors],
            "step_scales": [round(x, 3) for x in scales] if scales is not None else None,
        }
