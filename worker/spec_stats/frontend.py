"""The frontend side of exact per-request stats: vLLM's ``OutputProcessor``, subclassed.

vLLM's frontend detects stop strings. When one completes, it finishes the request at once and
aborts it in the engine core, which has run a step or more past the stop string by then, and
whose counts include those steps. The worker's scheduler (:mod:`worker.spec_stats.scheduler`) answers
that abort with the request's counts and the shape of its last steps. This processor holds the
request's final output until the answer arrives, and takes off the steps that came after the stop
string. It saw their outputs: vLLM drops them, since the request has finished in the frontend.
Then it releases the output with the exact counts of the steps the request kept.

The wait is one round trip to the engine core: the abort lands between two steps, and the answer
leaves with the next step's outputs. If no answer comes within ``wait_s``, or the shapes do not
add up (a preemption among the last steps), the output goes with the last periodic snapshot
instead, marked partial (:class:`PartialSpecDecodeMetrics`). Engine death releases every held
output the same way: its text was complete.

vLLM has no hook for any of this, so the processor overrides ``process_outputs`` (around vLLM's
own, which it calls unchanged) and ``_finish_request`` (to keep the state of a request it may
hold), and the engine's processor is switched to this class once the engine is built
(:func:`install`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from vllm.outputs import RequestOutput
from vllm.v1.engine.output_processor import OutputProcessor, OutputProcessorOutput, RequestState
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

from worker.spec_stats.scheduler import ANSWERS_ID, ANSWERS_KEY, NOT_VERIFIED, UNKNOWN, copy_metrics, decode_answer

__all__ = ["ExactStopStats", "PartialSpecDecodeMetrics", "install", "kept_counts"]

log = logging.getLogger(__name__)

# How long a final output waits for the engine core's answer. It takes about one engine step; this
# allows for a long prefill chunk in that step and a busy host.
STATS_WAIT_S = 10.0


class PartialSpecDecodeMetrics(RequestSpecDecodeMetrics):
    """Counts that could not be made exact (the last periodic snapshot): reported as partial."""

    partial = True


@dataclasses.dataclass(slots=True)
class _Held:
    collector: Any  # vLLM's RequestOutputCollector of the request
    output: RequestOutput  # its final output
    after: list[int]  # token counts of its outputs that came after the stop string, oldest first
    timer: asyncio.TimerHandle
    since: float  # time.monotonic() when it was held


class ExactStopStats(OutputProcessor):
    """vLLM's output processor, holding a stop string's final output until its exact counts arrive."""

    _held: dict[str, _Held]
    _finishing: dict[str, RequestState]
    wait_s: float
    # How held outputs were released ("exact", "partial"), and what was taken off the exact ones:
    # their outputs after the stop string, and vLLM's spec-decode counts of those steps
    # ("num_drafts", "num_draft_tokens", "num_accepted_tokens", as its engine-wide counters name
    # them: the per-request counts plus these add up to those counters).
    outcomes: collections.Counter[str]
    # Of the last releases: seconds held, outputs taken off (-1: released partial).
    recent: collections.deque[tuple[float, int]]

    def _init_exact_stop_stats(self, *, wait_s: float = STATS_WAIT_S) -> None:
        self._held = {}
        self._finishing = {}
        self.wait_s = wait_s
        self.outcomes = collections.Counter()
        self.recent = collections.deque(maxlen=4096)

    def process_outputs(
        self,
        engine_core_outputs: list[Any],
        engine_core_timestamp: float | None = None,
        iteration_stats: Any | None = None,
        weight_version: str | None = None,
    ) -> OutputProcessorOutput:
        if self._held:
            self._scan_held(engine_core_outputs)
            # A step's answers come last in its outputs (after any of a held request's own).
            if engine_core_outputs and engine_core_outputs[-1].request_id == ANSWERS_ID:
                for rid, answer in engine_core_outputs[-1].kv_transfer_params[ANSWERS_KEY].items():
                    self._release(rid, answer)
        result = super().process_outputs(engine_core_outputs, engine_core_timestamp, iteration_stats, weight_version)
        # The requests vLLM finished on a stop string and aborts in the engine core.
        for rid in result.reqs_to_abort:
            state = self._finishing.get(rid)
            if state is not None:
                self._hold(rid, state)
        self._finishing.clear()
        return result

    def _scan_held(self, engine_core_outputs: list[Any]) -> None:
        """The outputs of held requests, counted: vLLM ignores them (the request has finished here)."""
        held = self._held
        for output in engine_core_outputs:
            entry = held.get(output.request_id)
            if entry is not None:
                entry.after.append(len(output.new_token_ids))

    def _finish_request(self, req_state: RequestState) -> None:
        # Kept until the end of the next process_outputs: those it finished on a stop string may be held.
        super()._finish_request(req_state)
        self._finishing[req_state.request_id] = req_state

    def propagate_error(self, e: Exception) -> None:
        super().propagate_error(e)
        for rid in list(self._held):
            self._release(rid, None)

    def _hold(self, rid: str, state: RequestState) -> None:
        collector = state.queue
        if collector is None or state.parent_req is not None:  # not AsyncLLM's, or one of several sequences
            return
        output = collector.output
        if not isinstance(output, RequestOutput) or not output.finished:  # its final output, not yet taken
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not under AsyncLLM's output handler: nothing can wait
            return
        collector.output = None
        collector.ready.clear()
        timer = loop.call_later(self.wait_s, self._release, rid, None)
        self._held[rid] = _Held(collector, output, [], timer, time.monotonic())

    def _release(self, rid: str, flat: list[int] | None) -> None:
        """Release a held final output: with the counts of the steps it kept, from the engine core's
        answer (``flat``, ``worker.spec_stats.scheduler.encode_answer``), or partial (None: no answer)."""
        entry = self._held.pop(rid, None)
        if entry is None:
            return
        entry.timer.cancel()
        completion = entry.output.outputs[0]
        answer = None if flat is None else decode_answer(flat)
        exact = None
        if answer is not None:
            exact = kept_counts(
                answer.metrics,
                tail=answer.tail,
                after=entry.after,
                ended=answer.ended,
                final_accepted=answer.final_accepted,
            )
        if answer is not None and exact is not None:
            completion.spec_decode_metrics = exact
            self._count_taken_off(answer.metrics, exact, len(entry.after))
            self.recent.append((time.monotonic() - entry.since, len(entry.after)))
        else:
            completion.spec_decode_metrics = copy_metrics(completion.spec_decode_metrics, PartialSpecDecodeMetrics)
            self.outcomes["partial"] += 1
            self.recent.append((time.monotonic() - entry.since, -1))
            why = "no answer from the engine core" if answer is None else "its last steps could not be matched"
            log.info("request %s: exact spec-decode stats not available (%s); the last snapshot is reported", rid, why)
        entry.collector.put(entry.output)

    def _count_taken_off(self, whole: RequestSpecDecodeMetrics, kept: RequestSpecDecodeMetrics, outputs: int) -> None:
        outcomes = self.outcomes
        outcomes["exact"] += 1
        outcomes["outputs taken off"] += outputs
        if outputs:
            outcomes["num_drafts"] += sum(whole.histogram) - sum(kept.histogram)
            outcomes["num_draft_tokens"] += whole.num_draft_tokens - kept.num_draft_tokens
            outcomes["num_accepted_tokens"] += sum(
                j * (a - b) for j, (a, b) in enumerate(zip(whole.histogram, kept.histogram, strict=True))
            )


def kept_counts(
    metrics: RequestSpecDecodeMetrics,
    *,
    tail: Sequence[int],
    after: Sequence[int],
    ended: bool = False,
    final_accepted: int | None = None,
) -> RequestSpecDecodeMetrics | None:
    """The counts of the steps a request kept, or None where they cannot be told exactly.

    ``metrics``: its counts when the engine core let go of it; ``tail``: what its last steps
    verified, newest first (drafts verified, NOT_VERIFIED or UNKNOWN); ``after``: the token count
    of each of its outputs after the one with the stop string, oldest first: the steps to take off.
    A verified step yields its accepted drafts plus one token. ``ended``: the core finished the
    request itself in its newest step, whose tokens vLLM trimmed at that stop; it accepted
    ``final_accepted`` drafts.
    """
    if len(after) > len(tail):
        return None
    histogram = list(metrics.histogram)
    drafted = metrics.num_draft_tokens
    verified = 0
    for i, num_tokens in enumerate(reversed(after)):
        shape = tail[i]
        if shape == UNKNOWN:
            return None
        if shape == NOT_VERIFIED:
            if num_tokens != 1:
                return None
            continue
        accepted = num_tokens - 1
        if ended and i == 0:
            if final_accepted is None:
                return None
            accepted = final_accepted
        if not 0 <= accepted < len(histogram) or not histogram[accepted]:
            return None
        histogram[accepted] -= 1
        drafted -= shape
        verified += 1
    if drafted < 0:
        return None
    steps = len(metrics.per_step_accepted) - verified
    return RequestSpecDecodeMetrics(
        metrics.num_spec_tokens,
        histogram,
        drafted,
        metrics.per_step_accepted[: max(steps, 0)],
        metrics.per_step_drafted[: max(steps, 0)],
    )


def install(llm: Any, *, wait_s: float = STATS_WAIT_S) -> ExactStopStats:
    """Switch the engine's output processor to :class:`ExactStopStats` (vLLM builds its own inside
    ``AsyncLLM``; the subclass adds no state vLLM's methods see). Call it only where the engine
    core runs the worker's scheduler, which answers the aborts."""
    processor = llm.output_processor
    processor.__class__ = ExactStopStats
    processor._init_exact_stop_stats(wait_s=wait_s)
    return processor  # type: ignore[no-any-return]
