"""The frontend side of exact per-request stats: vLLM's ``OutputProcessor``, subclassed.

vLLM's frontend detects stop strings. When one completes, it finishes the request at once and
aborts it in the engine core, which has run a step or more past the stop string by then, and
whose counts include those steps. The worker's scheduler (:mod:`worker.vllm_internals.scheduler`) answers
that abort with the request's counts and the shape of its last steps. This processor holds the
request's final output until the answer arrives, and takes off the steps that came after the stop
string. It saw their outputs: vLLM drops them, since the request has finished in the frontend.
Then it releases the output with the exact counts of the steps the request kept.

The wait is one round trip to the engine core: the abort lands between two steps, and the answer
leaves with the next step's outputs. If no answer comes within ``wait_s``, or the shapes do not
add up (a preemption among the last steps), the output goes with the last periodic snapshot
instead, marked partial. Engine death releases every held output the same way: its text was
complete. Every release says how it went (:class:`~worker.speculation.stats.tracking.Release`, on the
counts it goes out with): the request's observers count them by outcome and reason.

It fails loud and fast: the boot sends one stop-string request and requires it released exact
(``worker.boot.launch.check_exact_stop_stats``); if it is not, or if ``NO_ANSWER_LIMIT`` held
outputs in a row get no answer, holding is switched off for the engine's life
(:meth:`ExactStopStats.stop_holding`, an error logged naming the cause): stop strings' final
outputs then go out at once, partial, instead of each waiting for an answer that does not come.

vLLM has no hook for any of this, so the processor overrides ``process_outputs`` (around vLLM's
own, which it calls unchanged) and ``_finish_request`` (to keep the state of a request it may
hold), and the engine's processor is switched to this class once the engine is built
(:func:`install`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec
from vllm.outputs import RequestOutput
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.engine.output_processor import OutputProcessor, OutputProcessorOutput, RequestOutputCollector, RequestState
from vllm.v1.metrics.stats import IterationStats, RequestSpecDecodeMetrics

from worker.speculation.stats.answers import ANSWERS_ID, ANSWERS_KEY, Answer, SpecCounts, kept_counts
from worker.speculation.stats.tracking import Release, Released, ReleaseReason
from worker.vllm_internals.scheduler import copy_metrics

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

__all__ = [
    "CountsAfterStop",
    "ExactStopStats",
    "ReleasedSpecDecodeMetrics",
    "count_held_outputs",
    "install",
    "installed_exact_stop_stats",
]

log = logging.getLogger(__name__)

# How long a final output waits for the engine core's answer. It takes about one engine step; this
# allows for a long prefill chunk in that step and a busy host.
STATS_WAIT_S = 10.0
# Held outputs in a row released without an answer before holding is switched off for the
# engine's life: a core that has stopped answering would otherwise cost every stop string the wait.
NO_ANSWER_LIMIT = 3


class ReleasedSpecDecodeMetrics(RequestSpecDecodeMetrics, Released):
    """The counts a stop string's final output went out with, and how (``release``)."""

    @property
    def partial(self) -> bool:
        return not self.release.is_exact


@dataclasses.dataclass(slots=True)
class _Held:
    collector: RequestOutputCollector  # vLLM's collector of the request's outputs
    output: RequestOutput  # its final output
    after: list[int]  # token counts of its outputs that came after the stop string, oldest first
    timer: asyncio.TimerHandle
    since: float  # time.monotonic() when it was held


class ExactStopStats(OutputProcessor):
    """vLLM's output processor, holding a stop string's final output until its exact counts arrive.

    ``is_holding`` goes off for the engine's life (:meth:`stop_holding`) when the boot's check finds
    the core's answers do not come, or ``NO_ANSWER_LIMIT`` held outputs in a row got none: from then
    on a stop string's final output goes out at once, its counts marked partial."""

    _held: dict[str, _Held]
    _finishing: dict[str, RequestState]
    wait_s: float
    num_spec_tokens: int
    is_holding: bool
    holding_off_reason: str | None
    num_unanswered: int

    def _init_exact_stop_stats(self, *, num_spec_tokens: int, wait_s: float = STATS_WAIT_S) -> None:
        self._held = {}
        self._finishing = {}
        self.wait_s = wait_s
        self.num_spec_tokens = num_spec_tokens
        self.is_holding = True
        self.holding_off_reason = None
        self.num_unanswered = 0

    def process_outputs(
        self,
        engine_core_outputs: list[EngineCoreOutput],
        engine_core_timestamp: float | None = None,
        iteration_stats: IterationStats | None = None,
        weight_version: str | None = None,
    ) -> OutputProcessorOutput:
        if self._held:
            self._scan_held(engine_core_outputs)
            # A step's answers come last in its outputs (after any of a held request's own).
            last = engine_core_outputs[-1] if engine_core_outputs else None
            if last is not None and last.request_id == ANSWERS_ID and last.kv_transfer_params is not None:
                for rid, raw in last.kv_transfer_params[ANSWERS_KEY].items():
                    self._answered(rid, raw)
        result = super().process_outputs(engine_core_outputs, engine_core_timestamp, iteration_stats, weight_version)
        # The requests vLLM finished on a stop string and aborts in the engine core.
        for rid in result.reqs_to_abort:
            state = self._finishing.get(rid)
            if state is not None:
                self._hold(rid, state)
        self._finishing.clear()
        return result

    def outputs_after_stop(self) -> dict[str, int]:
        """Each held final output's request id -> the outputs of it the core has sent since its
        stop string (a test hook: what an answer that is late sees)."""
        return {rid: len(entry.after) for rid, entry in self._held.items()}

    def _scan_held(self, engine_core_outputs: Sequence[EngineCoreOutput]) -> None:
        count_held_outputs(self._held, engine_core_outputs)

    def _finish_request(self, req_state: RequestState) -> None:
        # Kept until the end of the next process_outputs: those it finished on a stop string may be held.
        super()._finish_request(req_state)
        self._finishing[req_state.request_id] = req_state

    def propagate_error(self, e: Exception) -> None:
        super().propagate_error(e)
        for rid in list(self._held):
            self._release(rid, None, reason="engine_error")

    def stop_holding(self, cause: str) -> None:
        """Switch holding off for the engine's life: what is held goes out now, partial, and so do
        later stop strings' final outputs, without waiting."""
        if not self.is_holding:
            return
        self.is_holding, self.holding_off_reason = False, cause
        log.error(
            "exact spec-decode stats for stop strings are off for this engine: %s; requests ending on a stop "
            "string report their counts as partial",
            cause,
        )
        for rid in list(self._held):
            self._release(rid, None, reason="holding_off")

    def _hold(self, rid: str, state: RequestState) -> None:
        collector = state.queue
        if collector is None or state.parent_req is not None:  # not AsyncLLM's, or one of several sequences
            return
        output = collector.output
        if not isinstance(output, RequestOutput) or not output.finished:  # its final output, not yet taken
            return
        if not self.is_holding:
            # Out now (the consumer has not run since vLLM put it: this is one synchronous call).
            self._mark(output, Release("holding_off"), None)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not under AsyncLLM's output handler: nothing can wait
            return
        collector.output = None
        collector.ready.clear()
        timer = loop.call_later(self.wait_s, self._release, rid, None, "no_answer")
        self._held[rid] = _Held(collector, output, [], timer, time.monotonic())

    def _answered(self, rid: str, raw: object) -> None:
        try:
            answer = Answer.from_wire(raw)
        except msgspec.ValidationError as exc:  # a core of another shape: say so once, then stop waiting
            self._release(rid, None, reason="unmatched")
            self.stop_holding(f"the engine core's answer is not of the expected shape ({exc})")
            return
        self._release(rid, answer)

    def _release(self, rid: str, answer: Answer | None, reason: ReleaseReason = "answered") -> None:
        """Release a held final output: with the counts of the steps it kept, from the engine core's
        answer, or partial (no answer: ``reason`` says why)."""
        entry = self._held.pop(rid, None)
        if entry is None:
            return
        entry.timer.cancel()
        held_s = time.monotonic() - entry.since
        exact = None
        if answer is not None:
            whole = answer.counts
            kept = kept_counts(
                whole, tail=answer.tail, after=entry.after, ended=answer.is_ended, final_accepted=answer.final_accepted
            )
            exact = None if kept is None else copy_metrics(kept, RequestSpecDecodeMetrics)
            reason = "answered" if exact is not None else "unmatched"
        if answer is not None and exact is not None:
            self.num_unanswered = 0
            release = Release("answered", held_s, len(entry.after), _taken_off(whole, exact))
        else:
            release = Release(reason, held_s)
            log.info(
                "request %s: exact spec-decode stats not available (%s); the last snapshot is reported", rid, reason
            )
        self._mark(entry.output, release, exact)
        entry.collector.put(entry.output)
        if reason == "no_answer":
            self.num_unanswered += 1
            if self.num_unanswered >= NO_ANSWER_LIMIT:
                self.stop_holding(f"{NO_ANSWER_LIMIT} stop strings in a row got no answer from the engine core")

    def _mark(self, output: RequestOutput, release: Release, exact: RequestSpecDecodeMetrics | None) -> None:
        """Give the output's completion the counts it goes out with, and how it was released (with
        no counts at all, zero counts: the stats still say they are partial)."""
        completion = output.outputs[0]
        counts = exact or completion.spec_decode_metrics or RequestSpecDecodeMetrics.new(self.num_spec_tokens)
        marked = copy_metrics(counts, ReleasedSpecDecodeMetrics)
        marked.release = release
        completion.spec_decode_metrics = marked


class CountsAfterStop(Protocol):
    after: list[int]  # token counts of a held request's outputs after its stop string, oldest first


def count_held_outputs(held: Mapping[str, CountsAfterStop], engine_core_outputs: Sequence[EngineCoreOutput]) -> None:
    """The outputs of held requests, counted on their entries (``after``): vLLM ignores them (the
    request has finished in the frontend). The frontend's scan of every step while it holds any."""
    for output in engine_core_outputs:
        entry = held.get(output.request_id)
        if entry is not None:
            entry.after.append(len(output.new_token_ids))


def _taken_off(whole: SpecCounts, kept: SpecCounts) -> tuple[int, int, int]:
    """Of vLLM's engine-wide counters (verify steps, draft tokens, accepted tokens), what the steps
    taken off had added: the per-request counts plus these add up to those counters."""
    pairs = list(zip(whole.histogram, kept.histogram, strict=True))
    return (
        sum(a - b for a, b in pairs),
        whole.num_draft_tokens - kept.num_draft_tokens,
        sum(j * (a - b) for j, (a, b) in enumerate(pairs)),
    )


def install(llm: AsyncLLM, *, num_spec_tokens: int, wait_s: float = STATS_WAIT_S) -> ExactStopStats:
    """Switch the engine's output processor to :class:`ExactStopStats` (vLLM builds its own inside
    ``AsyncLLM``; the subclass adds no state vLLM's methods see). Call it only where the engine
    core runs the worker's scheduler, which answers the aborts."""
    processor = llm.output_processor
    processor.__class__ = ExactStopStats
    assert isinstance(processor, ExactStopStats)
    processor._init_exact_stop_stats(num_spec_tokens=num_spec_tokens, wait_s=wait_s)
    return processor


def installed_exact_stop_stats(llm: AsyncLLM) -> ExactStopStats | None:
    """The engine's output processor where :func:`install` switched it (None: it did not)."""
    processor = llm.output_processor
    return processor if isinstance(processor, ExactStopStats) else None
