"""The bench's probes into vLLM: hooks that watch or steer an engine for a measurement, never for
serving. They sit in the seam, under its contract (:mod:`worker.vllm_internals.contract`, listed as
needed by this module), so that a vLLM upgrade that renames what they wrap fails the contract check
in seconds instead of leaving a bench run to measure nothing.

- :func:`trace_steps`: each engine step's shape, handed to a callback as the step's outcome reaches
  vLLM's scheduler (``Scheduler.update_from_output``): the speculation map's step trace
  (``worker/tools/bench/step_trace.py``).
- :func:`reject_drafts_at`: vLLM's V2 verification told to reject each draft with a probability of
  its own (``RejectionSampler``), the speculation map's acceptance mix
  (``worker/tools/bench/acceptance_mix.py``). The releases differ here: 0.32's sampler takes a mask
  of drafts to reject (``invalid_drafts``); 0.34's takes none, and the mask is applied to the draft
  ids its rejection kernel reads (a draft id below 0 is rejected, in both releases' kernels). Both
  variants sit below, one installed by the release that runs.
- :func:`probe_drafter`: vLLM's drafter passes timed, their CUDA-graph dispatch recorded and the
  target's steps counted (``worker/tools/bench/draft_step.py``). These are vLLM 0.32's V1 runner
  classes; 0.34 has no V1 runner, and the probe fails there with a sentence naming the release.
- :func:`outputs_round_trip` and :func:`engine_core_outputs`: vLLM's own transport of a step's
  outputs from the engine core to the frontend, for the exact-stats path's timing
  (``worker/tools/bench/stats_path.py``).

Each install wraps a method of vLLM's class in this process once (a second call returns False) and
is inherited by engine cores forked from it. Imports no vLLM module at load: each probe imports what
it wraps when it is installed.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from worker.errors import UnsupportedVllm
from worker.vllm_internals.variants import RELEASE

if TYPE_CHECKING:
    import torch

__all__ = [
    "DrafterRecords",
    "RatesFor",
    "StepShape",
    "engine_core_outputs",
    "invalid_drafts",
    "outputs_round_trip",
    "passing_invalid_drafts",
    "probe_drafter",
    "reject_drafts_at",
    "rejecting_through_draft_ids",
    "trace_steps",
]

# Marks a probe's wrapper (in the wrapper's own __dict__), so that a process wraps each method once.
_PROBE = "runpod_worker_probe"


def _is_probe(method: Any) -> bool:
    return bool(vars(method).get(_PROBE))


def _mark(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    wrapper.__dict__[_PROBE] = True
    return wrapper


# --- the step trace ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class StepShape:
    """One engine step, as its outcome reached the scheduler."""

    at: float  # time.monotonic() then
    num_seqs: int  # the sequences the step ran
    num_drafting: int  # the k the scheduler drafts for the next step
    num_verified: int  # the drafts the step verified
    num_tokens: int  # the tokens the target ran
    num_new: int  # the requests new in the step


def trace_steps(record: Callable[[StepShape], None]) -> bool:
    """Wraps vLLM's ``Scheduler.update_from_output`` so that each step's shape goes to ``record``
    first; False where this process already has the trace (the worker's schedulers reach the
    wrapper through ``super()``)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.update_from_output
    if _is_probe(original):
        return False

    def update_from_output(self: Scheduler, scheduler_output: Any, model_runner_output: Any) -> Any:
        now = time.monotonic()
        spec = scheduler_output.scheduled_spec_decode_tokens
        record(
            StepShape(
                at=now,
                num_seqs=len(scheduler_output.num_scheduled_tokens),
                num_drafting=scheduler_output.num_spec_tokens_to_schedule,
                num_verified=sum(map(len, spec.values())) if spec else 0,
                num_tokens=scheduler_output.total_num_scheduled_tokens,
                num_new=len(scheduler_output.scheduled_new_reqs),
            )
        )
        return original(self, scheduler_output, model_runner_output)

    Scheduler.update_from_output = _mark(update_from_output)  # type: ignore[method-assign]
    return True


# --- the acceptance mix -----------------------------------------------------------------------

RatesFor = Callable[[Sequence[str], Sequence[int], int], "np.ndarray[Any, Any]"]
"""(the step's request ids, their bounds in the verified logits, the number of logits) -> each
logit's chance that its draft stands (1.0: vLLM's verification alone decides)."""

# (mask, device) -> the mask on the device: vLLM's copy through pinned memory unless a test gives one.
CopyToDevice = Callable[[Any, Any], Any]


def invalid_drafts(
    rates_for: RatesFor, sampler: Any, logits: Any, input_batch: Any, *, copy_to_device: CopyToDevice | None = None
) -> torch.Tensor | None:
    """The drafts of a step to reject, one flag per verified logit, each at ``1 - rate``; None
    where every rate is 1, or under vLLM's adaptive verification (its rows move: its own comment in
    ``_verify_in_chunks``), where the step passes through unchanged."""
    import torch

    if sampler.enable_adaptive_verification:
        return None
    num_logits = logits.shape[0]
    per_logit = rates_for(input_batch.req_ids, input_batch.cu_num_logits_np, num_logits)
    if not (per_logit < 1.0).any():
        return None
    if copy_to_device is None:
        from vllm.utils.torch_utils import async_tensor_h2d

        def copy_to_device(array: Any, device: Any) -> Any:
            return async_tensor_h2d(array, device=device)

    # Through pinned memory, without waiting: a plain copy to the GPU would hold the host until the
    # step's forward pass ends, where V2's steps overlap the host's work.
    rejected: torch.Tensor = torch.rand(num_logits, device=logits.device) >= copy_to_device(per_logit, logits.device)
    return rejected


# (sampler, logits, input_batch) -> the drafts to reject, or None.
InvalidFor = Callable[[Any, Any, Any], "torch.Tensor | None"]


def passing_invalid_drafts(original: Callable[..., Any], invalid_for: InvalidFor) -> Callable[..., Any]:
    """vLLM 0.32's ``RejectionSampler.__call__``, given the step's drafts to reject beside its own
    (``invalid_drafts``: the kernel rejects them as it rejects a draft id below 0; only verification
    sees them)."""

    def __call__(self: Any, logits: Any, input_batch: Any, draft_logits: Any = None, invalid_drafts: Any = None) -> Any:
        rejected = invalid_for(self, logits, input_batch)
        if rejected is not None:
            invalid_drafts = rejected if invalid_drafts is None else invalid_drafts | rejected
        return original(self, logits, input_batch, draft_logits, invalid_drafts)

    return _mark(__call__)


def rejecting_through_draft_ids(
    original_call: Callable[..., Any], original_sample: Callable[..., Any], invalid_for: InvalidFor
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """vLLM 0.34's ``RejectionSampler.__call__`` and its module's ``rejection_sample``: the call
    works out the step's drafts to reject, and the kernel's launch reads them as draft ids of -1,
    which its kernel rejects (sampling parameters and watermarking keep the real ids: only the
    kernel's copy is marked). A batch over vLLM's chunk limit is verified in chunks, in order, each
    taking the next rows of the mask."""
    pending: list[tuple[Any, list[int]]] = []  # the step's mask and the rows taken so far

    def __call__(self: Any, logits: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        rejected = invalid_for(self, logits, input_batch)
        if rejected is None:
            return original_call(self, logits, input_batch, *args, **kwargs)
        pending.append((rejected, [0]))
        try:
            return original_call(self, logits, input_batch, *args, **kwargs)
        finally:
            pending.clear()

    def rejection_sample(target_logits: Any, draft_logits: Any, draft_sampled: Any, *args: Any, **kwargs: Any) -> Any:
        if pending:
            mask, taken = pending[-1]
            rows = draft_sampled.shape[0]
            draft_sampled = draft_sampled.masked_fill(mask[taken[0] : taken[0] + rows], -1)
            taken[0] += rows
        return original_sample(target_logits, draft_logits, draft_sampled, *args, **kwargs)

    return _mark(__call__), _mark(rejection_sample)


def reject_drafts_at(rates_for: RatesFor) -> bool:
    """Wraps vLLM's V2 verification in this process so that each draft stands with the chance
    ``rates_for`` gives its logit, under the release's variant (module docstring); False where this
    process already has it."""
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

    def invalid_for(sampler: Any, logits: Any, input_batch: Any) -> torch.Tensor | None:
        return invalid_drafts(rates_for, sampler, logits, input_batch)

    if _is_probe(RejectionSampler.__call__):
        return False
    if RELEASE == "0.32":
        RejectionSampler.__call__ = passing_invalid_drafts(RejectionSampler.__call__, invalid_for)  # type: ignore[method-assign]
        return True
    # The kernel's launch, as the sampler's module calls it (imported there from its utilities).
    namespace = vars(importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler"))
    call, sample = rejecting_through_draft_ids(RejectionSampler.__call__, namespace["rejection_sample"], invalid_for)
    RejectionSampler.__call__ = call  # type: ignore[method-assign]
    namespace["rejection_sample"] = sample
    return True


# --- the drafter's passes -----------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class DrafterRecords:
    """What :func:`probe_drafter` saw while ``is_on``: drafter passes ``(k, ms)``, dispatches
    ``(tokens, CUDA-graph mode, padded tokens)``, and the target's steps (counted always)."""

    is_on: bool = False
    passes: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    dispatches: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)
    num_steps: int = 0

    def clear(self) -> None:
        self.passes.clear()
        self.dispatches.clear()
        self.num_steps = 0


def probe_drafter(records: DrafterRecords) -> None:
    """Times vLLM's drafter passes (``SpecDecodeBaseProposer.propose``, between two device
    synchronisations), records each drafter forward's CUDA-graph dispatch and counts the target's
    steps (``GPUModelRunner.execute_model``), into ``records``. vLLM 0.32's V1 runner only: on
    another release it raises :class:`~worker.errors.UnsupportedVllm`."""
    if RELEASE != "0.32":
        raise UnsupportedVllm(
            f"the drafter's probe times vLLM 0.32's V1 runner (SpecDecodeBaseProposer, GPUModelRunner), "
            f"which vLLM {RELEASE} does not have; run it on vLLM 0.32"
        )
    import torch
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    propose = SpecDecodeBaseProposer.propose
    if _is_probe(propose):
        return
    dispatch = SpecDecodeBaseProposer._determine_batch_execution_and_padding
    execute = GPUModelRunner.execute_model
    on_gpu = torch.cuda.is_available()

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    def timed_propose(self: Any, num_speculative_tokens: int, *args: Any, **kwargs: Any) -> Any:
        if not records.is_on:
            return propose(self, num_speculative_tokens, *args, **kwargs)
        sync()
        start = time.perf_counter()
        out = propose(self, num_speculative_tokens, *args, **kwargs)
        sync()
        records.passes.append((num_speculative_tokens, (time.perf_counter() - start) * 1e3))
        return out

    def recorded_dispatch(self: Any, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
        out = dispatch(self, num_tokens, *args, **kwargs)
        if records.is_on:
            records.dispatches.append((num_tokens, str(out[0]), int(out[1])))
        return out

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        records.num_steps += 1
        return execute(self, *args, **kwargs)

    SpecDecodeBaseProposer.propose = _mark(timed_propose)  # type: ignore[method-assign]
    SpecDecodeBaseProposer._determine_batch_execution_and_padding = _mark(recorded_dispatch)  # type: ignore[method-assign]
    GPUModelRunner.execute_model = _mark(counted_execute)  # type: ignore[method-assign]


# --- the outputs' transport ---------------------------------------------------------------------


def outputs_round_trip() -> Callable[[Any], Any]:
    """vLLM's transport of a step's outputs (``EngineCoreOutputs``): its msgpack encode in the
    engine core, then its decode in the frontend."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)

    def round_trip(outputs: Any) -> Any:
        return decoder.decode(encoder.encode(outputs))

    return round_trip


def engine_core_outputs(outputs: list[Any]) -> Any:
    """A step's outputs as vLLM's engine core sends them (engine 0)."""
    from vllm.v1.engine import EngineCoreOutputs

    return EngineCoreOutputs(engine_index=0, outputs=outputs)
