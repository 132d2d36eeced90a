"""A stand-in for vLLM's scheduler, for the tests and the benchmark of the worker's scheduler hooks.

A test double beside the real thing (as httpx keeps its ``MockTransport``): vLLM's scheduler reduced
to what :class:`~worker.vllm_internals.scheduler.SpecMetricsSnapshots` calls (taking requests, handing
back a step's outputs for the tokens given it, finishing requests, its one exit ``_free_request``),
over vLLM's own ``Request`` objects, outputs and metrics. A real engine core cannot be stepped by
hand with chosen shapes (drafts, grammar-invalidated drafts, accepted counts, prefill chunks), which
is what the hooks' arithmetic is checked and timed on; the engine tests run the same hooks in the
real engine core. ``ControlledStandIn`` carries ``SPECULATION_CONTROL=auto``'s hooks the same way.
Imported by ``tests/test_stop_answers.py`` and the benchmark (``stats_path.py``, ``spec_map.py``);
never by the serving code.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

from vllm import SamplingParams
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics
from vllm.v1.request import Request, RequestStatus

from worker.vllm_internals.scheduler import SpecMetricsSnapshots
from worker.vllm_internals.scheduler_control import ControlledScheduling
from worker.vllm_internals.variants import row_index

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import ModelRunnerOutput

__all__ = [
    "ControlledStandIn",
    "HookedStandIn",
    "StandInScheduler",
    "add_drafting",
    "make_request",
    "step_inputs",
    "step_outputs",
]


class StandInScheduler:
    """vLLM's scheduler reduced to what the worker's hooks call. A step's update observes each
    scheduled request's drafts (vLLM's per-request metrics; ``is_observing=False`` leaves that to
    the caller, who times it), appends its tokens, and ends it at ``max_tokens`` (trimming the
    step's tokens in place, as vLLM does). ``entered`` / ``returned``: ``perf_counter_ns()`` at the
    update's start and end, so that a caller can time the hooks around it. ``num_spec_tokens`` and
    ``method`` set what vLLM's scheduler reads off its config (k; the speculative method), with
    vLLM's batch-size table (``dynamic_sd_lookup``) at k for up to ``max_batch_size`` requests, on
    ``device_type`` (a GPU's unless told)."""

    def __init__(
        self,
        *,
        is_observing: bool = True,
        num_spec_tokens: int = 0,
        method: str = "draft_model",
        max_batch_size: int = 0,
        device_type: str = "cuda",
    ) -> None:
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.is_observing = is_observing
        self.entered = self.returned = 0
        self.num_spec_tokens = num_spec_tokens
        self.dynamic_sd_lookup: list[int] | None = [num_spec_tokens] * (max_batch_size + 1) if max_batch_size else None
        # 0.32's scheduler says which GPU runner runs: V1 here (0.34 has only V2, the seam's variant).
        self.use_v2_model_runner = False
        self.vllm_config = cast(
            "VllmConfig",
            SimpleNamespace(
                speculative_config=SimpleNamespace(method=method, num_speculative_tokens_per_batch_size=None),
                device_config=SimpleNamespace(device_type=device_type),
                scheduler_config=SimpleNamespace(async_scheduling=False),
                # Eager: on V2 no CUDA graph bounds a step's batch.
                model_config=SimpleNamespace(enforce_eager=True),
                compilation_config=None,
            ),
        )

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.RUNNING
        self.requests[request.request_id] = request
        self.running.append(request)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Nothing to schedule: a step's inputs are the caller's (:func:`step_inputs`)."""
        return cast("SchedulerOutput", None)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        self.entered = time.perf_counter_ns()
        self.finished_req_ids.clear()  # vLLM's schedule() hands them on
        outputs: dict[int, EngineCoreOutputs] = {}
        invalid_drafts = scheduler_output.num_invalid_spec_tokens or {}
        rows = row_index(model_runner_output)
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            tokens = model_runner_output.sampled_token_ids[rows[rid]]
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid)
            metrics = request.spec_decode_metrics
            if drafts and metrics is not None and self.is_observing:
                metrics.observe(len(drafts) - invalid_drafts.get(rid, 0), len(tokens) - 1)
            finish = None
            room = (request.max_tokens or 0) - request.num_output_tokens
            if len(tokens) >= room:  # vLLM trims the step's tokens at the stop, in place
                del tokens[room:]
                request.status, finish = RequestStatus.FINISHED_LENGTH_CAPPED, FinishReason.LENGTH
            request.append_output_token_ids(list(tokens))
            output = EngineCoreOutput(request_id=rid, new_token_ids=list(tokens), finish_reason=finish)
            if finish is not None:
                output.spec_decode_metrics = metrics
                self._free_request(request)
            outputs.setdefault(request.client_index, EngineCoreOutputs(outputs=[])).outputs.append(output)
        self.returned = time.perf_counter_ns()
        return outputs

    def finish_requests(self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus) -> list[Request]:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or self.requests)
        finished = []
        for rid in ids:
            request = self.requests.get(rid)
            if request is not None and not request.is_finished():
                request.status = finished_status
                self._free_request(request)
                finished.append(request)
        return finished

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        """The frontend's abort of ``request_ids`` (as vLLM's engine core finishes them)."""
        return self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def _free_request(
        self, request: Request, delay_free_blocks: bool = False
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
        if request in self.running:
            self.running.remove(request)
        return None, None

    def has_requests(self) -> bool:
        return bool(self.requests or self.finished_req_ids)


class HookedStandIn(SpecMetricsSnapshots, StandInScheduler):
    """The worker's hooks over the stand-in, as ``SpecMetricsScheduler`` over vLLM's scheduler."""


class ControlledStandIn(ControlledScheduling, StandInScheduler):
    """``SPECULATION_CONTROL=auto``'s hooks over the stand-in, as ``SpecControlScheduler`` over vLLM's
    (without the exact-stats hooks: what the controller alone costs). Needs ``max_batch_size``."""


def make_request(
    rid: str, *, num_spec_tokens: int, stop: list[str] | None, max_tokens: int = 10**6, client: int = 0
) -> Request:
    """One of vLLM's engine-core requests, with the per-request metrics its scheduler gives them."""
    params = SamplingParams(stop=stop, max_tokens=max_tokens)
    request = Request(
        request_id=rid, prompt_token_ids=[1, 2, 3], sampling_params=params, pooling_params=None, client_index=client
    )
    request.spec_decode_metrics = RequestSpecDecodeMetrics.new(num_spec_tokens)
    return request


def add_drafting(scheduler: StandInScheduler, widths: Mapping[str, int], *, num_spec_tokens: int) -> None:
    """Running requests on ``scheduler``, each with its drafts for the next step (request id ->
    how many)."""
    for rid, width in widths.items():
        request = make_request(rid, num_spec_tokens=num_spec_tokens, stop=None)
        request.spec_token_ids = [-1] * width
        scheduler.add_request(request)


def step_inputs(
    *,
    num_scheduled_tokens: Mapping[str, int],
    drafts: Mapping[str, list[int]],
    invalid_drafts: Mapping[str, int] | None,
    sampled: Mapping[str, list[int]],
    num_spec_tokens_to_schedule: int | None = None,
    new_requests: Sequence[str] = (),
) -> tuple[SchedulerOutput, ModelRunnerOutput]:
    """vLLM's scheduler and model outputs of one step, holding only the fields the hooks and the
    stand-in read; the step drafts ``num_spec_tokens_to_schedule`` (default: as many as the most
    any request verifies); ``new_requests``: those scheduled for the first time."""
    drafted = (
        max(map(len, drafts.values()), default=0)
        if num_spec_tokens_to_schedule is None
        else num_spec_tokens_to_schedule
    )
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens=dict(num_scheduled_tokens),
        total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
        num_spec_tokens_to_schedule=drafted,
        scheduled_new_reqs=[SimpleNamespace(req_id=rid) for rid in new_requests],
        scheduled_spec_decode_tokens=dict(drafts),
        num_invalid_spec_tokens=None if invalid_drafts is None else dict(invalid_drafts),
    )
    model_output = SimpleNamespace(
        req_ids=list(sampled),
        req_id_to_index={rid: i for i, rid in enumerate(sampled)},
        sampled_token_ids=list(sampled.values()),
    )
    return cast("SchedulerOutput", scheduler_output), cast("ModelRunnerOutput", model_output)


def step_outputs(
    scheduler: StandInScheduler,
    *,
    num_scheduled_tokens: Mapping[str, int],
    drafts: Mapping[str, list[int]],
    invalid_drafts: Mapping[str, int] | None,
    sampled: Mapping[str, list[int]],
) -> dict[int, EngineCoreOutputs]:
    """One engine step through ``scheduler`` (:func:`step_inputs`): its outputs per client."""
    inputs = step_inputs(
        num_scheduled_tokens=num_scheduled_tokens, drafts=drafts, invalid_drafts=invalid_drafts, sampled=sampled
    )
    return scheduler.update_from_output(*inputs)
