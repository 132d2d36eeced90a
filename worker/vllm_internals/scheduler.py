"""The engine-core side of exact per-request stats: vLLM's schedulers, subclassed.

vLLM attaches a request's spec-decode metrics only to the engine core's final output. Two endings
get none: a stop string, which vLLM's frontend detects and then aborts the request in the core
(which has run a step or more past it by then and sends nothing back), and a cancellation.

- A stop string: these subclasses answer the abort. The answer is the request's counts as the core
  let go of it and the shape of its last steps, its *tail*: for each recent
  step that yielded it tokens, how many drafts that step verified, or that it verified none. The
  frontend (:mod:`worker.vllm_internals.frontend`) knows how many of those steps came after the stop string
  (it saw their outputs, and dropped them), and takes them off. A request the core finished itself
  (EOS, ``max_tokens``) after the frontend's stop string is answered the same way when the abort
  comes, for ``ENDED_STEPS`` steps (with what the ring still holds of its tail).
- A cancellation: every request gets a snapshot of its counts every ``SNAPSHOT_EVERY_STEPS``
  steps; the frontend keeps the latest (what a cancelled request reports, marked partial).

Per request per step nothing is done: a step appends its scheduler output to a short ring (what
a tail is read from, only when an abort is answered), and while requests with stop strings run,
takes the step's token counts per request (one C-level ``map``: what a request finished in the
core yielded before vLLM trimmed it). vLLM turns async scheduling off for n-gram under the name
``ngram`` (then ``SpecMetricsScheduler``) and keeps it for ``ngram_gpu`` and draft models
(``SpecMetricsAsyncScheduler``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
from vllm.v1.request import Request, RequestStatus

from worker.speculation.stats.answers import ANSWERS_ID, ANSWERS_KEY, NOT_VERIFIED, UNKNOWN, Answer, Counts, SpecCounts
from worker.vllm_internals.variants import row_index

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

    # The mixin is checked against vLLM's scheduler, whose methods it overrides and calls.
    _SchedulerBase = Scheduler
else:
    _SchedulerBase = object

from worker.vllm_internals.scheduler_control import ControlledScheduling

__all__ = [
    "ENDED_STEPS",
    "RING_STEPS",
    "SCHEDULER_CLASSES",
    "SNAPSHOT_EVERY_STEPS",
    "TAIL_STEPS",
    "AnswerBooks",
    "SpecControlAsyncScheduler",
    "SpecControlScheduler",
    "SpecMetricsAsyncScheduler",
    "SpecMetricsScheduler",
    "SpecMetricsSnapshots",
    "copy_metrics",
    "install",
]

# Engine steps between snapshots of every request: a cancelled request then reports counts at
# most this many steps old (marked partial); a stop string's ending is exact without them.
SNAPSHOT_EVERY_STEPS = 64
# Steps of a request an answer describes (newest first): how far behind the core the frontend's
# stop string may be. Steps kept in the ring: those, plus the steps since a request the core
# finished itself ended (its abort can come that much later).
TAIL_STEPS = 8
RING_STEPS = 2 * TAIL_STEPS
# Steps for which a request with stop strings that the core finished itself is remembered: an abort
# of it answered even when the ring no longer holds its tail (the frontend then reports the counts
# partial at once, instead of waiting out its timeout for an answer that would never come).
ENDED_STEPS = 1024
_M = TypeVar("_M", bound=RequestSpecDecodeMetrics)


@dataclasses.dataclass(slots=True)
class _Ended:
    """A request with stop strings that the core finished itself: what answers its abort, if the
    frontend's stop string came first."""

    client_index: int
    metrics: RequestSpecDecodeMetrics
    step: int  # the step that finished it (the newest of its tail)
    final_accepted: int | None  # drafts accepted in that step (None: not known, or not verified)


@dataclasses.dataclass(frozen=True, slots=True)
class AnswerBooks:
    """What the hooks hold between steps (:meth:`SpecMetricsSnapshots.answer_books`)."""

    with_stops: frozenset[str]  # requests with stop strings in the core
    ended: frozenset[str]  # of those, the ones the core finished itself, still remembered
    pending: dict[int, list[str]]  # answers to send with the next step's outputs: client -> request ids


class SpecMetricsSnapshots(_SchedulerBase):
    """Scheduler mixin: answer the abort of a request with stop strings with its counts and tail,
    and snapshot every request's counts every ``SNAPSHOT_EVERY_STEPS`` steps."""

    requests: dict[str, Request]
    _num_steps = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Of the last RING_STEPS steps the core processed: (step number, and from vLLM's scheduler output
        # the tokens scheduled per request, the drafts, those a grammar invalidated).
        self._ring: collections.deque[tuple[int, dict[str, int], dict[str, list[int]], dict[str, int] | None]] = (
            collections.deque(maxlen=RING_STEPS)
        )
        self._with_stops: set[str] = set()  # requests with stop strings in the core
        self._ended: dict[str, _Ended] = {}
        self._ended_order: collections.deque[tuple[int, str]] = collections.deque()
        # To send with the next step's outputs: client index -> request id -> answer.
        self._answers: dict[int, dict[str, Any]] = {}
        # While vLLM's update runs: the model output, and each request's token count before vLLM
        # trimmed it at a stop (EOS, max_tokens); the output's rows by request id, once a step needs them.
        self._model_output: ModelRunnerOutput | None = None
        self._yielded: list[int] | None = None
        self._rows: Mapping[str, int] | None = None

    def answer_books(self) -> AnswerBooks:
        """A copy of what the hooks hold now (a test hook: the engine core never asks)."""
        return AnswerBooks(
            frozenset(self._with_stops),
            frozenset(self._ended),
            {client: list(answers) for client, answers in self._answers.items()},
        )

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        params = request.sampling_params
        if params is not None and params.stop and request.spec_decode_metrics is not None:
            self._with_stops.add(request.request_id)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        if self._with_stops:
            self._model_output = model_runner_output
            self._yielded = list(map(len, model_runner_output.sampled_token_ids))
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self._model_output = self._yielded = self._rows = None
        step = self._num_steps = self._num_steps + 1
        self._ring.append(
            (
                step,
                scheduler_output.num_scheduled_tokens,
                scheduler_output.scheduled_spec_decode_tokens,
                scheduler_output.num_invalid_spec_tokens,
            )
        )
        if self._answers:
            self._send_answers(outputs)
        order = self._ended_order
        while order and order[0][0] <= step - ENDED_STEPS:
            self._ended.pop(order.popleft()[1], None)
        if step % SNAPSHOT_EVERY_STEPS == 0:
            self._snapshot_all(outputs)
        return outputs

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus) -> list[Request]:
        if finished_status == RequestStatus.FINISHED_ABORTED and request_ids is not None:
            request_ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            with_stops, ended_ones = self._with_stops, self._ended
            for rid in request_ids:
                if rid in with_stops:
                    request = self.requests[rid]
                    metrics = request.spec_decode_metrics
                    if metrics is not None:
                        running = request.status == RequestStatus.RUNNING
                        tail = self._tail(rid, until=self._num_steps) if running else [UNKNOWN]
                        self._answer(request.client_index, rid, Answer(counts=Counts.of(metrics), tail=tail))
                elif ended_ones and (ended := ended_ones.pop(rid, None)) is not None:
                    answer = Answer(
                        counts=Counts.of(ended.metrics),
                        tail=self._tail(rid, until=ended.step),
                        is_ended=True,
                        final_accepted=ended.final_accepted,
                    )
                    self._answer(ended.client_index, rid, answer)
        return super().finish_requests(request_ids, finished_status)

    def _free_request(
        self, request: Request, delay_free_blocks: bool = False
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        # vLLM's one exit for every finished request (a private method, in the seam's contract: an
        # upgrade that renames it fails the contract test and the boot's check).
        if self._with_stops and request.request_id in self._with_stops:
            self._with_stops.discard(request.request_id)
            if request.status != RequestStatus.FINISHED_ABORTED:
                self._remember_end(request)
        return super()._free_request(request, delay_free_blocks)

    def has_requests(self) -> bool:
        # Answers wait for a step to carry them: one for a request the core had already finished
        # (its abort frees nothing, so vLLM's own check would let an idle core sleep).
        return bool(self._answers) or super().has_requests()

    def _remember_end(self, request: Request) -> None:
        """The core finished a request with stop strings itself: keep what answers its abort."""
        rid = request.request_id
        if request.spec_decode_metrics is None:
            return
        step = self._num_steps + 1  # the step being processed
        final_accepted = None
        output, yielded = self._model_output, self._yielded
        if output is not None and yielded is not None:
            rows = self._rows
            if rows is None:
                rows = self._rows = row_index(output)
            index = rows.get(rid)
            if index is not None and index < len(yielded):
                final_accepted = yielded[index] - 1
        self._ended[rid] = _Ended(request.client_index, request.spec_decode_metrics, step, final_accepted)
        self._ended_order.append((step, rid))

    def _tail(self, rid: str, *, until: int) -> list[int]:
        """What each of the request's last steps up to step ``until`` verified, newest first: the
        drafts it verified (vLLM's count: less those a grammar invalidated), NOT_VERIFIED, or
        UNKNOWN (where the walk stops). Runs once per answered abort: kept to a few dict lookups a step."""
        tail: list[int] = []
        append = tail.append
        for step, scheduled, spec, invalid in reversed(self._ring):
            num_tokens = scheduled.get(rid)
            if num_tokens is None or step > until:
                continue
            drafts = spec.get(rid)
            if not drafts:  # vLLM verifies only a step with drafts
                code = NOT_VERIFIED if num_tokens == 1 else UNKNOWN
            elif num_tokens == len(drafts) + 1:
                code = len(drafts) - invalid.get(rid, 0) if invalid else len(drafts)
            else:
                code = UNKNOWN  # not a decode step: a prefill chunk, a recomputation
            append(code)
            if code == UNKNOWN or len(tail) == TAIL_STEPS:
                break
        return tail

    def _answer(self, client_index: int, rid: str, answer: Answer) -> None:
        """Queue the answer to an abort, for the next step's outputs to that client."""
        answers = self._answers.get(client_index)
        if answers is None:
            answers = self._answers[client_index] = {}
        answers[rid] = answer.to_wire()

    def _send_answers(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """The step's answers, one output per client, last in its list (where the frontend looks)."""
        for client_index, answers in self._answers.items():
            answer = EngineCoreOutput(
                request_id=ANSWERS_ID, new_token_ids=[], kv_transfer_params={ANSWERS_KEY: answers}
            )
            engine_outputs = outputs.get(client_index)
            if engine_outputs is None:
                outputs[client_index] = EngineCoreOutputs(outputs=[answer])
            else:
                engine_outputs.outputs.append(answer)
        self._answers = {}

    def _snapshot_all(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        requests = self.requests
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                if output.spec_decode_metrics is None:  # else vLLM's own, on the final output
                    request = requests.get(output.request_id)
                    if request is not None and request.spec_decode_metrics is not None:
                        output.spec_decode_metrics = copy_metrics(request.spec_decode_metrics, RequestSpecDecodeMetrics)


def copy_metrics(m: SpecCounts, cls: type[_M]) -> _M:
    """A copy of ``m`` (vLLM's counts, or the worker's :class:`Counts`) as ``cls`` (vLLM's class, or a
    subclass). A snapshot must be a copy: the core goes on mutating
    the live object (the next step may run while the output thread serialises this one)."""
    return cls(
        num_spec_tokens=m.num_spec_tokens,
        histogram=m.histogram.copy(),
        num_draft_tokens=m.num_draft_tokens,
        per_step_accepted=m.per_step_accepted.copy(),
        per_step_drafted=m.per_step_drafted.copy(),
    )


class SpecMetricsScheduler(SpecMetricsSnapshots, Scheduler):
    pass


class SpecMetricsAsyncScheduler(SpecMetricsSnapshots, AsyncScheduler):
    pass


# SPECULATION_CONTROL=auto: k chosen per step (worker/speculation/controller.py), with the same exact stats.
class SpecControlScheduler(ControlledScheduling, SpecMetricsSnapshots, Scheduler):
    pass


class SpecControlAsyncScheduler(ControlledScheduling, SpecMetricsSnapshots, AsyncScheduler):
    pass


# (is_controlled, is_async) -> the scheduler class; every one of them keeps the exact stats.
SCHEDULER_CLASSES: dict[tuple[bool, bool], type[Scheduler]] = {
    (False, False): SpecMetricsScheduler,
    (False, True): SpecMetricsAsyncScheduler,
    (True, False): SpecControlScheduler,
    (True, True): SpecControlAsyncScheduler,
}


def install(vllm_config: VllmConfig, *, is_auto: bool) -> None:
    """Give the engine core the worker's scheduler: the exact stats always, and the controller's
    hooks where ``SPECULATION_CONTROL=auto`` (``is_auto``) meets vLLM's batch-size schedule (which
    ``engine_args`` adds). vLLM turns async scheduling off for n-gram drafted under the name
    ``ngram`` (V1's CPU proposer, or V2 under that name) and keeps it for ``ngram_gpu`` and draft
    models: the class follows the config vLLM resolved."""
    spec = vllm_config.speculative_config
    is_controlled = spec is not None and is_auto and spec.uses_dynamic_speculative_decoding()
    sched = vllm_config.scheduler_config
    sched.scheduler_cls = SCHEDULER_CLASSES[is_controlled, bool(sched.async_scheduling)]
