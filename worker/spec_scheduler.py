"""The engine-core side of exact per-request stats: vLLM's schedulers, subclassed.

vLLM attaches a request's spec-decode metrics only to the engine core's final output, so a request
finished by a stop string (detected in the frontend) or cancelled gets none. These subclasses make
the core attach snapshots: for a request with stop strings, on each step that can complete one
(:mod:`worker.stop_triggers`), and for every request every ``SNAPSHOT_EVERY_STEPS`` steps (what a
cancelled request reports); the frontend keeps the latest. vLLM turns async scheduling off for
n-gram drafts (then ``SpecMetricsScheduler``) and keeps it for draft models
(``SpecMetricsAsyncScheduler``).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

from worker.stop_triggers import EVERY, Every, StopTriggers, TriggerSet, completing

__all__ = [
    "SNAPSHOT_EVERY_STEPS",
    "SpecMetricsAsyncScheduler",
    "SpecMetricsScheduler",
    "SpecMetricsSnapshots",
    "stop_triggers",
]

log = logging.getLogger(__name__)

# Engine steps between snapshots of every request: a cancelled request then reports counts at
# most this many steps old (marked partial); exact endings need no periodic snapshot.
SNAPSHOT_EVERY_STEPS = 64
# The per-step test of an output no request watches: no trigger in it.
_UNWATCHED = frozenset[int]().isdisjoint


def stop_triggers(tokenizer: Any, *, vocab_size: int) -> StopTriggers | None:
    """The trigger table for the tokenizers vLLM's frontend detokenizes with its fast path
    (``FastIncrementalDetokenizer``, over ``tokenizer._tokenizer``); None for the others, whose
    requests then keep a snapshot on every step."""
    from vllm.v1.engine.detokenizer import uses_fast_detokenizer

    if tokenizer is None or not uses_fast_detokenizer(tokenizer):
        return None
    return StopTriggers.from_tokenizer(tokenizer._tokenizer, vocab_size=vocab_size)


class SpecMetricsSnapshots:
    """Scheduler mixin: attach snapshots of requests' spec-decode metrics to non-final outputs.

    vLLM attaches a request's metrics only to the output on which the engine core finishes it.
    A request with stop strings may be finished by the frontend instead (which detects them), so
    it gets a snapshot on each step whose tokens can complete one of its stop strings (its
    trigger set, :class:`StopTriggers`): its final output then carries the counts up to and
    including its last step. Every request gets one every ``SNAPSHOT_EVERY_STEPS`` steps, for
    what a cancelled request reports. This runs once per request per step inside the engine
    core's loop, so it stays cheap: between periodic steps it looks only at the outputs of
    requests with stop strings (one dict lookup and one ``isdisjoint`` of the step's few token
    ids against the request's trigger set; nothing at all when no such request runs), and a
    snapshot is one small copy: the core goes on mutating the live object (the next step may run
    while the output thread still serialises this one).

    The trigger table is built from the tokenizer on a background thread at the first request
    with stop strings; requests added before it is ready get a snapshot on every step, as do
    requests on tokenizers vLLM detokenizes with its slow path.
    """

    requests: dict[str, Any]
    _num_steps = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Requests with stop strings (added since the last periodic step, which prunes the
        # finished ones): id -> the ``isdisjoint`` of the token ids whose presence in a step's
        # output may complete one (a bound C method: the per-step test is one call), and id ->
        # that trigger (EVERY: every step is one, e.g. while the detokenizer holds text back).
        self._watch: dict[str, Callable[[list[int]], bool]] = {}
        self._trigger_of: dict[str, TriggerSet | Every] = {}
        # How many watched requests have each trigger, and the one they all share (None: none
        # watched, several, or EVERY): then the per-step test needs no lookup by request id.
        self._trigger_count: collections.Counter[TriggerSet | Every] = collections.Counter()
        self._shared: TriggerSet | None = None
        # Requests whose text ends inside a character: their own trigger, restored once a step
        # ends on a whole character.
        self._held: dict[str, TriggerSet | Every] = {}
        self._triggers: StopTriggers | None = None
        self._triggers_started = False

    def add_request(self, request: Any) -> None:
        super().add_request(request)  # type: ignore[misc]
        params = request.sampling_params
        if params is not None and params.stop and request.spec_decode_metrics is not None:
            stops = [params.stop] if isinstance(params.stop, str) else params.stop
            triggers = self._triggers
            if triggers is None and not self._triggers_started:
                self._start_triggers()
            rid = request.request_id
            if triggers is None:
                self._set_trigger(rid, EVERY)
                return
            self._set_trigger(rid, triggers.for_stops(stops))
            prompt = request.prompt_token_ids
            if prompt is None or triggers.ends_inside_character(prompt[-16:]) is not False:
                # The detokenizer holds back a prompt that ends inside a character and releases
                # it with the first tokens: held from the start.
                self._update_held(rid, True)

    def _set_trigger(self, rid: str, trigger: TriggerSet | Every | None) -> None:
        """Watch ``rid`` with ``trigger`` (None: stop watching it)."""
        count = self._trigger_count
        old = self._trigger_of.pop(rid, None)
        if old is not None:
            count[old] -= 1
            if not count[old]:
                del count[old]
        if trigger is None:
            self._watch.pop(rid, None)
        else:
            self._trigger_of[rid] = trigger
            self._watch[rid] = trigger.isdisjoint if isinstance(trigger, Every) else trigger.ids.isdisjoint
            count[trigger] += 1
        only = next(iter(count)) if len(count) == 1 else None
        self._shared = only if isinstance(only, TriggerSet) else None

    def _start_triggers(self) -> None:
        self._triggers_started = True
        manager = getattr(self, "structured_output_manager", None)
        tokenizer = getattr(manager, "tokenizer", None)
        vocab_size = self.vllm_config.model_config.get_vocab_size()  # type: ignore[attr-defined]

        def build() -> None:
            try:
                self._triggers = stop_triggers(tokenizer, vocab_size=vocab_size)
            except Exception:  # the every-step snapshots stay: exact, only dearer
                log.exception("stop-string trigger table not built; snapshots on every step stay")

        threading.Thread(target=build, name="stop-triggers", daemon=True).start()

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._num_steps += 1
        if self._num_steps % SNAPSHOT_EVERY_STEPS == 0:
            self._snapshot_all(outputs)
            return outputs
        watch = self._watch
        if not watch:
            return outputs
        shared = self._shared
        for engine_outputs in outputs.values():
            if shared is not None:
                # One trigger set for every watched request (all of an agent's requests carry the
                # same stop strings): one C-level test per output, unwatched ones included (a hit
                # of theirs is dropped in _on_triggers).
                isdisjoint = shared.ids.isdisjoint
                hits = [o for o in engine_outputs.outputs if not isdisjoint(o.new_token_ids)]
            else:
                get = watch.get
                hits = [o for o in engine_outputs.outputs if not get(o.request_id, _UNWATCHED)(o.new_token_ids)]
            if hits:
                self._on_triggers(hits, shared)
        return outputs

    def _on_triggers(self, hits: list[Any], shared: TriggerSet | None) -> None:
        """Steps of requests with stop strings that hit their trigger sets: snapshot those that
        can complete one (:func:`~worker.stop_triggers.completing`, one call for all of a step's hits)."""
        for output, request, trigger in completing(hits, self._trigger_of, self.requests, shared):
            output.spec_decode_metrics = _snapshot(request.spec_decode_metrics)
            self._follow_held(output.request_id, trigger, output.new_token_ids)

    def _follow_held(self, rid: str, trigger: TriggerSet | Every, new: list[int]) -> None:
        """Hold a request on every step while its text may be held back; release it after."""
        triggers = self._triggers
        # Only a step with a piece of a character (in every trigger set's ``always``), or a step
        # of a request held already (whose trigger is EVERY), can change what is held.
        if triggers is not None and (trigger is EVERY or not triggers.partial.isdisjoint(new)):
            self._update_held(rid, triggers.ends_inside_character(new))

    def _update_held(self, rid: str, held: bool | None) -> None:
        if held:
            if rid not in self._held:
                self._held[rid] = self._trigger_of[rid]
                self._set_trigger(rid, EVERY)
        elif held is False and rid in self._held:
            self._set_trigger(rid, self._held.pop(rid))

    def _snapshot_all(self, outputs: Any) -> None:
        requests, watch, trigger_of = self.requests, self._watch, self._trigger_of
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                if output.spec_decode_metrics is None:  # else vLLM's own, on the final output
                    request = requests.get(output.request_id)
                    if request is not None and request.spec_decode_metrics is not None:
                        output.spec_decode_metrics = _snapshot(request.spec_decode_metrics)
                trigger = trigger_of.get(output.request_id)
                if trigger is not None:
                    self._follow_held(output.request_id, trigger, output.new_token_ids)
        for rid in watch.keys() - requests.keys():
            self._set_trigger(rid, None)
            self._held.pop(rid, None)


def _snapshot(m: RequestSpecDecodeMetrics | None) -> RequestSpecDecodeMetrics | None:
    # Positional fields: a quarter of ``dataclasses.replace``'s cost.
    if m is None:
        return None
    return RequestSpecDecodeMetrics(
        m.num_spec_tokens,
        m.histogram.copy(),
        m.num_draft_tokens,
        m.per_step_accepted.copy(),
        m.per_step_drafted.copy(),
    )


class SpecMetricsScheduler(SpecMetricsSnapshots, Scheduler):
    pass


class SpecMetricsAsyncScheduler(SpecMetricsSnapshots, AsyncScheduler):
    pass
