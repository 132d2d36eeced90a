"""The bench's probes into vLLM (worker/vllm_internals/probes.py): the step trace, the rejection of
drafts at chosen rates in both releases' shapes, the drafter's probe, and vLLM's transport of a
step's outputs. vLLM's V2 GPU runner does not run on a CPU, so its sampler and kernel launch are
stood in for by recording fakes; each install is checked on vLLM's own class."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from worker.errors import UnsupportedVllm
from worker.vllm_internals import probes
from worker.vllm_internals.probes import (
    DrafterRecords,
    StepShape,
    engine_core_outputs,
    invalid_drafts,
    outputs_round_trip,
    passing_invalid_drafts,
    reject_drafts_at,
    rejecting_through_draft_ids,
    trace_steps,
)
from worker.vllm_internals.stand_in import HookedStandIn, make_request, step_inputs
from worker.vllm_internals.variants import RELEASE


@dataclass
class FakeInputBatch:
    """The two fields of vLLM's V2 ``InputBatch`` the probe reads."""

    req_ids: list[str]
    cu_num_logits_np: list[int]


@dataclass
class FakeSampler:
    """The one attribute of vLLM's V2 sampler the probe reads."""

    enable_adaptive_verification: bool = False


def _by_request(rates: Sequence[float]) -> probes.RatesFor:
    """Each request's logits at its own rate (requests in order)."""

    def rates_for(req_ids: Sequence[str], cu_num_logits: Sequence[int], num_logits: int) -> Any:
        return np.repeat(np.asarray(rates[: len(req_ids)], dtype=np.float32), np.diff(cu_num_logits))[:num_logits]

    return rates_for


def _invalid_for(rates: Sequence[float]) -> probes.InvalidFor:
    def invalid_for(sampler: Any, logits: Any, input_batch: Any) -> Any:
        return invalid_drafts(
            _by_request(rates), sampler, logits, input_batch, copy_to_device=lambda a, d: torch.as_tensor(a, device=d)
        )

    return invalid_for


PER_REQUEST = 4000
BATCH = FakeInputBatch(["a", "b", "c"], [0, PER_REQUEST, 2 * PER_REQUEST, 3 * PER_REQUEST])


def test_0_32_drafts_are_rejected_at_each_rate_beside_vllms_own() -> None:
    seen: dict[str, Any] = {}

    def fake_original_call(self: Any, logits: Any, input_batch: Any, draft_logits: Any, invalid: Any) -> str:
        seen["invalid"] = invalid
        return "verified"

    logits = torch.zeros(3 * PER_REQUEST, 2)
    given = torch.zeros(3 * PER_REQUEST, dtype=torch.bool)
    given[0] = True  # vLLM's own invalid drafts stay invalid
    call = passing_invalid_drafts(fake_original_call, _invalid_for([1.0, 0.5, 0.0]))
    assert call(FakeSampler(), logits, BATCH, None, given) == "verified"
    invalid = seen["invalid"].reshape(3, PER_REQUEST)
    assert invalid[0, 0] and invalid[0, 1:].sum() == 0
    assert 0.45 < invalid[1].float().mean() < 0.55
    assert invalid[2].all()
    # Every rate at 1 passes vLLM's mask through untouched, and so does a sampler under vLLM's
    # adaptive verification (its rows move).
    passing = passing_invalid_drafts(fake_original_call, _invalid_for([1.0, 1.0, 1.0]))
    passing(FakeSampler(), logits, BATCH, None, None)
    assert seen["invalid"] is None
    call(FakeSampler(enable_adaptive_verification=True), logits, BATCH, None, given)
    assert seen["invalid"] is given


def test_0_34_drafts_are_rejected_through_the_kernels_draft_ids_chunk_by_chunk() -> None:
    launches: list[Any] = []

    def fake_sample(target_logits: Any, draft_logits: Any, draft_sampled: Any, *rest: Any) -> Any:
        launches.append(draft_sampled)
        return "sampled"

    def fake_original_call(self: Any, logits: Any, input_batch: Any, draft_logits: Any = None) -> list[Any]:
        # vLLM verifies a batch over its chunk limit in chunks, in order (``_verify_in_chunks``).
        ids = torch.arange(logits.shape[0])
        return [sample(logits[lo:hi], draft_logits, ids[lo:hi]) for lo, hi in ((0, 5000), (5000, logits.shape[0]))]

    call, sample = rejecting_through_draft_ids(fake_original_call, fake_sample, _invalid_for([1.0, 0.5, 0.0]))
    logits = torch.zeros(3 * PER_REQUEST, 2)
    assert call(FakeSampler(), logits, BATCH) == ["sampled", "sampled"]
    ids = torch.cat(launches).reshape(3, PER_REQUEST)
    assert (ids[0] >= 0).all()  # the kernel's copy: the real ids, or -1 to reject
    assert 0.45 < (ids[1] == -1).float().mean() < 0.55
    assert (ids[2] == -1).all()
    kept = ids[1] >= 0
    assert torch.equal(ids[1][kept], torch.arange(PER_REQUEST, 2 * PER_REQUEST)[kept])
    # Outside a step with rejections (every rate 1, adaptive verification, a launch of its own)
    # the kernel reads vLLM's ids.
    launches.clear()
    call(FakeSampler(enable_adaptive_verification=True), logits, BATCH)
    sample(logits, None, torch.arange(3))
    assert all((ids >= 0).all() for ids in launches) and len(launches) == 3


def test_the_rejection_is_installed_once_on_vllms_sampler_in_the_releases_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    original = RejectionSampler.__call__
    # The 0.32 wrapper passes these on by position, as vLLM's model runner calls it.
    if RELEASE == "0.32":
        assert list(inspect.signature(original).parameters) == [
            "self",
            "logits",
            "input_batch",
            "draft_logits",
            "invalid_drafts",
        ]
    monkeypatch.setattr(RejectionSampler, "__call__", original)  # restored after the test
    assert reject_drafts_at(_by_request([1.0])) is True
    assert RejectionSampler.__call__ is not original
    assert reject_drafts_at(_by_request([0.5])) is False


def test_each_step_shape_reaches_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    updates: list[Any] = []

    def update(self: Any, scheduler_output: Any, model_runner_output: Any) -> str:
        updates.append(scheduler_output)
        return "outputs"

    monkeypatch.setattr(Scheduler, "update_from_output", update)  # vLLM's own is restored after the test
    steps: list[StepShape] = []
    assert trace_steps(steps.append) is True
    assert trace_steps(steps.append) is False
    output = SimpleNamespace(
        num_scheduled_tokens={"a": 4, "b": 1, "c": 30},
        scheduled_spec_decode_tokens={"a": [5, 6, 7]},
        num_spec_tokens_to_schedule=2,
        total_num_scheduled_tokens=35,
        scheduled_new_reqs=["c"],
    )
    assert Scheduler.update_from_output(object(), output, None) == "outputs"  # type: ignore[arg-type,comparison-overlap]
    assert updates == [output]
    ((step),) = steps
    assert (step.num_seqs, step.num_drafting, step.num_verified, step.num_tokens, step.num_new) == (3, 2, 3, 35, 1)


def test_the_drafters_probe_is_installed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    if RELEASE != "0.32":
        with pytest.raises(UnsupportedVllm, match=r"run it on vLLM 0\.32"):
            probes.probe_drafter(DrafterRecords())
        return
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    for cls, name in (
        (SpecDecodeBaseProposer, "propose"),
        (SpecDecodeBaseProposer, "_determine_batch_execution_and_padding"),
        (GPUModelRunner, "execute_model"),
    ):
        monkeypatch.setattr(cls, name, vars(cls)[name])  # restored after the test
    propose = SpecDecodeBaseProposer.propose
    probes.probe_drafter(DrafterRecords())
    wrapped = SpecDecodeBaseProposer.propose
    probes.probe_drafter(DrafterRecords())
    assert wrapped is not propose and SpecDecodeBaseProposer.propose is wrapped


def test_a_steps_outputs_cross_vllms_transport() -> None:
    scheduler = HookedStandIn(is_observing=False)
    request = make_request("r", num_spec_tokens=2, stop=None)
    scheduler.add_request(request)
    inputs = step_inputs(
        num_scheduled_tokens={"r": 3}, drafts={"r": [0, 0]}, invalid_drafts=None, sampled={"r": [7, 8]}
    )
    outputs = scheduler.update_from_output(*inputs)[0].outputs
    decoded = outputs_round_trip()(engine_core_outputs(outputs))
    assert [o.request_id for o in decoded.outputs] == [o.request_id for o in outputs]
    assert [list(o.new_token_ids) for o in decoded.outputs] == [[7, 8]]
