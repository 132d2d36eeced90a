"""The scheduler hooks of ``SPECULATION_CONTROL=auto`` (:mod:`worker.speculation.controller` has the controller):
vLLM's ``dynamic_sd_lookup`` answered by the controller, fed each step's (drafted, accepted) pairs,
and a capped request's drafts trimmed before a step is scheduled (the controller caps none alone
where the engine replays full CUDA graphs: :mod:`worker.speculation.controller`). The mixin is checked against
vLLM's scheduler (imported for the type checker only), whose methods it overrides and calls."""

from __future__ import annotations

import collections
import itertools
import os
import time
from typing import TYPE_CHECKING, Any, cast

from worker.config.speculation import EAGLE_METHODS, NGRAM_METHODS
from worker.speculation.controller import REVIEW_EVERY_STEPS, SAMPLE_SEQUENCES, SpeculationController
from worker.speculation.cost import STEP_COSTS
from worker.speculation.decide import is_graph_schedule
from worker.vllm_internals.plugin import DRAFT_SKIP_ENV
from worker.vllm_internals.variants import runs_v2_model_runner

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.outputs import ModelRunnerOutput

    _SchedulerBase = Scheduler
else:
    _SchedulerBase = object

__all__ = ["ControlledScheduling"]

_NO_DRAFTS: tuple[int, ...] = ()


class ControlledScheduling(_SchedulerBase):
    """Scheduler mixin (before vLLM's scheduler in the MRO): vLLM's ``dynamic_sd_lookup`` is the
    controller, fed each step's (drafted, accepted) pairs; a capped request's drafts are trimmed
    before the step is scheduled (vLLM trims drafts the same way when a step's budget is short).
    Needs a speculative config with a batch-size schedule (``engine_args`` adds one for ``auto``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        schedule = self.dynamic_sd_lookup
        if schedule is None:
            raise ValueError("SPECULATION_CONTROL=auto needs vLLM's batch-size schedule (engine_args adds one)")
        spec = self.vllm_config.speculative_config
        cost = STEP_COSTS[_cost_key(self.vllm_config)]
        # A runner without V2's graphs (the CPU build's; 0.32's V1 on a GPU) runs any k. The V2 runner
        # captures full graphs for the query lengths of the schedule's k values only, each up to a
        # batch size of its own (_full_graph_batches): the controller chooses among those, and 0
        # (speculation off), which runs piecewise unless the schedule holds it. The worker's own V2 schedule only lists
        # those k values (one batch size each, worker.speculation.decide.auto_schedule): no ceiling.
        allowed: set[int] | None = None
        graph_batches: list[int] | None = None
        ceiling: list[int] | None = schedule
        is_v2 = runs_v2_model_runner(self)
        if is_v2:
            allowed = set(schedule[1:]) | {0}
            graph_batches = _full_graph_batches(self.vllm_config, self.num_spec_tokens)
            given = spec.num_speculative_tokens_per_batch_size if spec is not None else None
            if is_graph_schedule(given, self.num_spec_tokens):
                ceiling = None
        self.controller = SpeculationController(
            num_spec_tokens=self.num_spec_tokens,
            cost=cost,
            schedule=ceiling,
            allowed_ks=allowed,
            graph_batches=graph_batches,
            # The model's figures are a GPU's; a CPU's steps (the tests' engines) would rescale them
            # out of the choices they check.
            calibrate=self.vllm_config.device_config.device_type != "cpu",
            drafts_after_output=is_v2,
        )
        # vLLM only indexes its table by batch size (``dynamic_sd_lookup[n]``), as the controller answers.
        self.dynamic_sd_lookup = cast("list[int]", self.controller)
        self._control_steps = 0
        self._scheduled_at: dict[int, float] = {}

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        caps = self.controller.caps
        if caps:
            requests = self.requests
            for rid, cap in caps.items():
                request = requests.get(rid)
                if request is not None and len(request.spec_token_ids) > cap:
                    request.spec_token_ids = request.spec_token_ids[:cap]
        was_idle = not self.running
        output = super().schedule(throttle_prefills)
        if was_idle:
            # A step scheduled on an idle engine: its time runs from here, not from the last outcome
            # (the controller's observe). By the output's id, which its update gets back (a few in
            # flight with async scheduling; cleared if any is ever lost).
            scheduled = self._scheduled_at
            if len(scheduled) > 8:
                scheduled.clear()
            scheduled[id(output)] = time.monotonic()
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        spec = scheduler_output.scheduled_spec_decode_tokens
        sampled = model_runner_output.sampled_token_ids
        pairs: dict[tuple[int, int], int] = {}
        d = verified = 0  # the drafts a request verified this step (where all verified alike), in all
        if spec:
            widths = set(map(len, spec.values()))
            d = max(widths)
            verified = d * len(spec) if len(widths) == 1 else sum(map(len, spec.values()))
        if spec and sampled:
            # (drafts verified, drafts accepted) -> sequences, in C-level passes over the batch.
            # The first SAMPLE_SEQUENCES of the batch: evidence enough per step, at a bounded cost.
            yielded = list(map(len, sampled[:SAMPLE_SEQUENCES]))  # 1 + accepted, where drafts were verified
            if len(widths) == 1 and len(spec) == len(sampled):  # every request verified the same k
                pairs = {(d, y - 1): n for y in range(1, d + 2) if (n := yielded.count(y))}
            else:
                req_ids = model_runner_output.req_ids[:SAMPLE_SEQUENCES]
                drafted = map(len, map(spec.get, req_ids, itertools.repeat(_NO_DRAFTS)))
                counted = collections.Counter(zip(drafted, yielded, strict=False))
                pairs = {(d, y - 1): n for (d, y), n in counted.items() if d and y}
        controller = self.controller
        # The step's shape as the cost model prices it: the k it drafted for the next step (vLLM's
        # num_spec_tokens_to_schedule, the controller's answer; on V2 the controller files the time
        # under the step before's), the drafts it verified (drafted the step before).
        shape = (
            len(scheduler_output.num_scheduled_tokens),
            scheduler_output.num_spec_tokens_to_schedule,
            verified,
            scheduler_output.total_num_scheduled_tokens,
        )
        controller.observe(
            pairs,
            step=shape,
            scheduled_at=self._scheduled_at.pop(id(scheduler_output), None),
            joined=len(scheduler_output.scheduled_new_reqs),
        )
        step = self._control_steps = self._control_steps + 1
        if step % REVIEW_EVERY_STEPS == 0:
            # A generator over the running requests with counts, read once per review.
            live = ((r, r.spec_decode_metrics) for r in self.running if r.spec_decode_metrics)
            controller.review(
                ((r.request_id, m.histogram, m.num_draft_tokens, r.num_output_tokens) for r, m in live),
                batch_size=max(1, len(self.running)),
            )
        return super().update_from_output(scheduler_output, model_runner_output)


def _full_graph_batches(vllm_config: Any, num_spec_tokens: int) -> list[int] | None:
    """By k (0..num_spec_tokens), the most sequences a decode step at that k carries and still
    replays one of V2's full CUDA graphs, or None where the engine runs none (eager, or a mode
    without full graphs). V2 (``vllm/v1/worker/gpu/cudagraph_utils.py``, ``_init_candidates``)
    captures uniform decode graphs of each capture size rounded up to a multiple of the query
    length ``k + 1``, dropping any past the largest capture size; a batch pads up to the next one.
    Under FULL (one routine for every step, ``worker.speculation.decide``) it captures each size
    as it is, for any mix of query lengths: a step replays one up to the largest size in tokens
    (the decode graphs the worker's plugin adds beside them, ``worker.vllm_internals.plugin``, move no bound).
    Mirrored here, since vLLM keeps the result inside its model runner, out of the scheduler's reach."""
    compilation, model = vllm_config.compilation_config, vllm_config.model_config
    if model.enforce_eager:
        return None
    if not compilation.cudagraph_mode.has_full_cudagraphs():
        return None
    sizes, largest = compilation.cudagraph_capture_sizes, compilation.max_cudagraph_capture_size
    if not sizes or not largest:
        return None
    if not compilation.cudagraph_mode.separate_routine():
        return [largest // (k + 1) for k in range(num_spec_tokens + 1)]
    batches = []
    for k in range(num_spec_tokens + 1):
        query = k + 1
        rounded = (-(-size // query) * query for size in sizes)
        batches.append(max((tokens // query for tokens in rounded if tokens <= largest), default=0))
    return batches


def _cost_key(vllm_config: Any) -> str:
    """Which of :data:`worker.speculation.cost.STEP_COSTS` prices this engine's steps: n-gram with async
    scheduling (V2's GPU proposer as ``ngram_gpu``) or without it, an EAGLE head, else a draft model,
    with its pass at k = 0 or without it (the boot plan's marker, which the seam's plugin reads too)."""
    spec = vllm_config.speculative_config
    if spec is not None and spec.method in EAGLE_METHODS:
        return "eagle"
    if spec is None or spec.method not in NGRAM_METHODS:
        return "draft_model_skip" if os.environ.get(DRAFT_SKIP_ENV) == "1" else "draft_model"
    return "ngram" if vllm_config.scheduler_config.async_scheduling else "ngram_sync"
