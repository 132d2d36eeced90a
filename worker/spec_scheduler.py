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

__all__ = ["SNAPSHOT_EVERY_STEPS", "SpecMetricsAsyncScheduler", "SpecMetricsScheduler"]

# Engine steps between snapshots for requests without stop strings: a cancelled request then
# reports counts at most this many steps old (marked partial); exact endings need no snapshot.
SNAPSHOT_EVERY_STEPS = 8


class _SpecMetricsSnapshots:
    """Scheduler mixin: attach snapshots of requests' spec-decode metrics to non-final outputs.

    vLLM attaches a request's metrics only to the output on which the engine core finishes it.
    A request with stop strings may be finished by the frontend instead (which detects them), so
    it gets a snapshot on every step: its final output then carries the counts up to and
    including its last step. Every other request gets one every ``SNAPSHOT_EVERY_STEPS`` steps,
    for what a cancelled request reports. This runs once per request per step inside the engine
    core's loop, so it stays a dict lookup and, where due, one small copy: the core goes on
    mutating the live object (the next step may run while the output thread still serialises
    this one). The constructor with positional fields costs a quarter of ``dataclasses.replace``.
    """

    requests: dict[str, Any]
    _num_steps = 0

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        self._num_steps += 1
        is_periodic = self._num_steps % SNAPSHOT_EVERY_STEPS == 0
        requests = self.requests
        for engine_outputs in outputs.values():
            for output in engine_outputs.outputs:
                if output.spec_decode_metrics is not None:  # vLLM's own, on the final output
                    continue
                request: Any = requests.get(output.request_id)
                m = None if request is None else request.spec_decode_metrics
                if m is not None and (is_periodic or request.sampling_params.stop):
                    output.spec_decode_metrics = RequestSpecDecodeMetrics(
                        m.num_spec_tokens,
                        m.histogram.copy(),
                        m.num_draft_tokens,
                        m.per_step_accepted.copy(),
                        m.per_step_drafted.copy(),
                    )
        return outputs


class SpecMetricsScheduler(_SpecMetricsSnapshots, Scheduler):
    pass


class SpecMetricsAsyncScheduler(_SpecMetricsSnapshots, AsyncScheduler):
    pass
