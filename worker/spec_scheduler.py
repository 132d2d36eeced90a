"""The engine-core side of exact per-request stats: vLLM's schedulers, subclassed.

vLLM attaches a request's spec-decode metrics only to the engine core's final output, so a request
finished by a stop string (detected in the frontend) or cancelled gets none. These subclasses make
the core attach snapshots (every step for a request with stop strings, every few steps for the
others); the frontend keeps the latest. vLLM turns async scheduling off for n-gram drafts (then
``SpecMetricsScheduler``) and keeps it for draft models (``SpecMetricsAsyncScheduler``).
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

__all__ = ["SNAPSHOT_EVERY_STEPS", "SpecMetricsAsyncScheduler", "SpecMetricsScheduler", "SpecMetricsSnapshots"]

# Engine steps between snapshots for requests without stop strings: a cancelled request then
# reports counts at most this many steps old (marked partial); exact endings need no snapshot.
SNAPSHOT_EVERY_STEPS = 8


class SpecMetricsSnapshots:
    """Scheduler mixin: attach snapshots of requests' spec-decode metrics to non-final outputs.

    vLLM attaches a request's metrics only to the output on which the engine core finishes it.
    A request with stop strings may be finished by the frontend instead (which detects them), so
    it gets a snapshot on every step: its final output then carries the counts up to and
    including its last step. Every other request gets one every ``SNAPSHOT_EVERY_STEPS`` steps,
    for what a cancelled request reports. This runs once per request per step inside the engine
    core's loop, so it stays cheap: on the seven steps in eight between snapshots it looks only
    at the outputs of requests with stop strings (none at all when no such request runs: the
    loop is skipped), and a snapshot is one small copy: the core goes on mutating the live
    object (the next step may run while the output thread still serialises this one). The
    constructor with positional fields costs a quarter of ``dataclasses.replace``.
    """

    requests: dict[str, Any]
    _num_steps = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Ids of requests with stop strings added since the last snapshot step (which prunes
        # the finished ones): requests for which every step's counts must reach the frontend.
        self._stop_ids: set[str] = set()

    def add_request(self, request: Any) -> None:
        super().add_request(request)  # type: ignore[misc]
        params = request.sampling_params
        if params is not None and params.stop:
            self._stop_ids.add(request.request_id)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._num_steps += 1
        is_periodic = self._num_steps % SNAPSHOT_EVERY_STEPS == 0
        stop_ids = self._stop_ids
        if is_periodic:
            stop_ids.intersection_update(self.requests)
        elif not stop_ids:
            return outputs
        requests = self.requests
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                if output.spec_decode_metrics is not None:  # vLLM's own, on the final output
                    continue
                if not is_periodic and output.request_id not in stop_ids:
                    continue
                request: Any = requests.get(output.request_id)
                m = None if request is None else request.spec_decode_metrics
                if m is not None:
                    output.spec_decode_metrics = RequestSpecDecodeMetrics(
                        m.num_spec_tokens,
                        m.histogram.copy(),
                        m.num_draft_tokens,
                        m.per_step_accepted.copy(),
                        m.per_step_drafted.copy(),
                    )
        return outputs


class SpecMetricsScheduler(SpecMetricsSnapshots, Scheduler):
    pass


class SpecMetricsAsyncScheduler(SpecMetricsSnapshots, AsyncScheduler):
    pass
