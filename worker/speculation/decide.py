"""What speculation needs from the settings, decided once: :func:`decide` returns a
:class:`SpeculationPlan`, which the boot plan stores (``BootPlan.speculation``) and every later
step reads instead of asking again.

The ``auto`` values depend on one another: ``SPECULATION_CONTROL=auto`` moves n-gram and EAGLE
heads to vLLM's V2 runner, which keeps full CUDA graphs under a batch-size schedule, and n-gram
there runs vLLM's FULL graph mode. So :func:`decide` answers in one order, each answer from those
before it and never from a later one: the facts that depend on no ``auto`` (eager mode, full
graphs, the worker's scheduler, the drafter), then the control, then the runner, then the graph
mode, then vLLM's speculative config. Why each default is what it is, with the runs behind it,
and the whole decision table: docs/speculation.md (``tests/test_speculation_decide.py`` walks that
table through :func:`decide`). Reads only the settings: imports without vLLM.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from worker.config import DeploymentMode, Settings
from worker.config.speculation import drafts_by_eagle, drafts_by_ngram, drafts_with_model

__all__ = [
    "JOIN_CAPTURE_TOKENS",
    "SpeculationControl",
    "SpeculationPlan",
    "auto_schedule",
    "decide",
    "is_graph_schedule",
]

SpeculationControl = Literal["auto", "static"]

# The largest step (tokens) given a full CUDA graph where the worker chooses FULL: 256 sequences at
# k = 3, or 128 at k = 4 with prompts joining, which vLLM's own bound on Hopper,
# min(2 * max_num_seqs * (1 + k), 512), would leave without a graph.
JOIN_CAPTURE_TOKENS = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class SpeculationPlan:
    """Everything the boot needs about speculation and CUDA graphs, decided by :func:`decide`.
    ``speculative_config`` is a plain dict (the plan crosses into the pod's API processes): callers
    copy it."""

    control: SpeculationControl  # SPECULATION_CONTROL, or its default
    model_runner: str | None  # vLLM's VLLM_USE_V2_MODEL_RUNNER: "1" (V2), "0" (V1), None (vLLM's choice)
    is_eager: bool  # no compilation, no CUDA graphs (ENFORCE_EAGER, or the tiny model)
    has_cuda_graphs: bool  # a GPU, and not eager (by the settings or ENGINE_ARGS)
    cudagraph_mode: str | None  # vLLM's cudagraph_mode as given to it; None: vLLM's own (or none: eager)
    max_cudagraph_capture_size: int | None  # None: vLLM's own
    is_worker_full_graphs: bool  # FULL chosen by the worker: its plugin adds decode graphs, vLLM's config marked
    speculative_config: dict[str, Any] | None  # vLLM's, as the worker builds it (ENGINE_ARGS may replace it)
    is_exact_stats: bool  # the worker's scheduler and output processor: exact per-request stats

    @property
    def schedule(self) -> list[list[int]] | None:
        """vLLM's batch-size schedule of k (``[start, end, k]`` ranges): the user's, or ``auto``'s."""
        schedule = (self.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
        return [list(entry) for entry in schedule] if schedule is not None else None

    @property
    def compilation_config(self) -> dict[str, Any] | None:
        """vLLM's ``compilation_config`` for these choices; None: vLLM's own."""
        config = {"cudagraph_mode": self.cudagraph_mode, "max_cudagraph_capture_size": self.max_cudagraph_capture_size}
        return {key: value for key, value in config.items() if value is not None} or None

    def shown(self) -> dict[str, Any]:
        """The decisions as the job's ``served`` block, the pod's ``/plan`` and the boot's log line
        show them: ``null`` for a runner or a graph mode left to vLLM, and for a control without
        speculation."""
        return {
            "speculation_control": self.control if self.speculative_config is not None else None,
            "model_runner": _runner_name(self.model_runner),
            "cudagraph_mode": self.cudagraph_mode if self.has_cuda_graphs else "NONE",
            "speculative_tokens_by_batch": self.schedule,
            "spec_decode_available": self.is_exact_stats,
        }


def _runner_name(flag: str | None) -> Literal["v1", "v2"] | None:
    """``VLLM_USE_V2_MODEL_RUNNER`` as vLLM reads it (an integer, non-zero: V2); None: vLLM's choice,
    or a value vLLM refuses at boot."""
    try:
        return None if flag is None else ("v2" if int(flag) else "v1")
    except ValueError:
        return None


def decide(settings: Settings, *, mode: DeploymentMode, is_cpu: bool) -> SpeculationPlan:
    """The plan for ``settings`` in ``mode`` on vLLM's CPU build (``is_cpu``) or a GPU. One pass,
    each answer from the ones before it (module docstring; the table: docs/speculation.md)."""
    engine_args = settings.engine_args or {}
    spec = settings.resolved_speculative_config
    # Facts no auto value depends on.
    is_eager = settings.enforce_eager or settings.is_tiny_default  # the tiny model boots faster uncompiled
    has_cuda_graphs = not is_cpu and not is_eager and not engine_args.get("enforce_eager")
    # Full CUDA graphs for the target, which V2 keeps under a schedule.
    has_full_graphs = has_cuda_graphs and settings.cudagraph_mode not in ("NONE", "PIECEWISE")
    # The worker's scheduler (exact stats, and the controller under auto): not turned off, not replaced.
    runs_worker_scheduler = settings.per_request_spec_decode_metrics != "none" and "scheduler_cls" not in engine_args
    is_ngram, is_eagle, is_draft_model = drafts_by_ngram(spec), drafts_by_eagle(spec), drafts_with_model(spec)
    users_runner = _users_model_runner(settings)

    control = _control(
        settings,
        mode=mode,
        is_measured=not is_cpu and not settings.is_tiny_default and runs_worker_scheduler and is_ngram,
        users_runner=users_runner,
        has_full_graphs=has_full_graphs,
    )
    runner = _model_runner(
        mode=mode,
        users_runner=users_runner,
        is_draft_model=is_draft_model,
        is_v2_under_auto=control == "auto" and has_full_graphs and (is_ngram or is_eagle),
    )
    # FULL for n-gram under auto on V2: a step a request joins replays a full graph too.
    is_worker_full_graphs = (
        settings.cudagraph_mode == "auto"
        and has_full_graphs
        and runs_worker_scheduler
        and is_ngram
        and control == "auto"
        and runner == "1"
    )
    is_captured = not is_cpu and not is_eager
    cudagraph_mode, capture = _graphs(
        settings, mode=mode, is_full=is_worker_full_graphs, speculates=spec is not None, is_captured=is_captured
    )
    on_v2 = not is_cpu and runner == "1"
    if spec is not None:
        spec = _speculative_config(
            spec, is_ngram=is_ngram, on_v2=on_v2, control=control, controls_v2=on_v2 and runs_worker_scheduler
        )
    # Exact stats wherever the engine speculates (ENGINE_ARGS' config included) under the worker's scheduler.
    speculates = engine_args.get("speculative_config", spec) is not None
    return SpeculationPlan(
        control=control,
        model_runner=runner,
        is_eager=is_eager,
        has_cuda_graphs=has_cuda_graphs,
        cudagraph_mode=cudagraph_mode,
        max_cudagraph_capture_size=capture,
        is_worker_full_graphs=is_worker_full_graphs,
        speculative_config=spec,
        is_exact_stats=speculates and runs_worker_scheduler,
    )


def _users_model_runner(settings: Settings) -> str | None:
    """``VLLM_USE_V2_MODEL_RUNNER`` as the user chose it (``MODEL_RUNNER``, or vLLM's own variable), else None."""
    if settings.model_runner != "auto":
        return "1" if settings.model_runner == "v2" else "0"
    return settings.vllm_use_v2_model_runner


def _control(
    settings: Settings, *, mode: DeploymentMode, is_measured: bool, users_runner: str | None, has_full_graphs: bool
) -> SpeculationControl:
    """``SPECULATION_CONTROL``, or its default: ``auto`` only where the GPU map measured it at or
    above the static choice, n-gram on V2 with full graphs and the worker's scheduler
    (``is_measured`` holds the rest: a GPU, a real model, the scheduler, n-gram); ``static`` for the
    others (docs/speculation.md says why for each)."""
    if settings.speculation_control is not None:
        return settings.speculation_control
    if not is_measured or not has_full_graphs:
        return "static"
    if users_runner is not None:
        return "auto" if users_runner == "1" else "static"
    # A pod runs V2 anyway; a serverless worker keeps V1, whose boots skip V2's kernel warm-up.
    return "auto" if mode == "pod" else "static"


def _model_runner(
    *, mode: DeploymentMode, users_runner: str | None, is_draft_model: bool, is_v2_under_auto: bool
) -> str | None:
    """``VLLM_USE_V2_MODEL_RUNNER``: the user's; V1 for a draft model (V2 runs it without CUDA
    graphs); V2 for n-gram and EAGLE heads under ``auto`` (V1 turns the target's full graphs
    piecewise under a schedule); V1 for serverless (a shorter boot); else vLLM's (V2 for pods)."""
    if users_runner is not None:
        return users_runner
    if is_draft_model:
        return "0"
    if is_v2_under_auto:
        return "1"
    return "0" if mode == "serverless" else None


def _graphs(
    settings: Settings, *, mode: DeploymentMode, is_full: bool, speculates: bool, is_captured: bool
) -> tuple[str | None, int | None]:
    """``CUDAGRAPH_MODE`` and ``MAX_CUDAGRAPH_CAPTURE_SIZE`` as given to vLLM (None: vLLM's own).

    ``auto`` keeps vLLM's mode (FULL_AND_PIECEWISE), but for the worker's FULL (``is_full``), with
    graphs up to :data:`JOIN_CAPTURE_TOKENS`. Under a mode without piecewise graphs a serverless
    worker captures no decode batch larger than it takes jobs (``MAX_CONCURRENCY``); under vLLM's
    mode the capture sizes serve its piecewise graphs too, and with speculation a step is ``1 + k``
    tokens a sequence: vLLM's sizes there. An eager engine, or the CPU build, captures nothing."""
    if not is_captured:
        return None, None
    cudagraph_mode = None if settings.cudagraph_mode == "auto" else settings.cudagraph_mode
    capture = settings.max_cudagraph_capture_size
    if is_full:
        cudagraph_mode, capture = "FULL", capture or JOIN_CAPTURE_TOKENS
    if capture is None and mode == "serverless" and not speculates and cudagraph_mode in ("FULL_DECODE_ONLY", "FULL"):
        capture = settings.max_concurrency
    return cudagraph_mode, capture


def _speculative_config(
    spec: dict[str, Any], *, is_ngram: bool, on_v2: bool, control: SpeculationControl, controls_v2: bool
) -> dict[str, Any]:
    """vLLM's speculative config for the decisions: n-gram on V2 named ``ngram_gpu``, and under
    ``auto`` a batch-size schedule unless the user gave one.

    V2 drafts both n-gram names on the GPU, but vLLM 0.32 keeps async scheduling only for the name
    ``ngram_gpu`` (under ``ngram`` every step waits for the host); not on V1, whose GPU proposer
    ran slower than its CPU one. The schedule is what lets vLLM change k per step, and the worker's
    scheduler answers its lookups (``controller.py``): on V1 one range, the configured k; on V2
    under the worker's controller every k from the configured one to 0, so that V2 captures full
    graphs for each (:func:`auto_schedule`)."""
    if is_ngram and on_v2:
        spec = {key: value for key, value in spec.items() if key != "model"} | {"method": "ngram_gpu"}
    k = spec.get("num_speculative_tokens")
    if control == "auto" and isinstance(k, int) and k > 0:
        spec.setdefault("num_speculative_tokens_per_batch_size", auto_schedule(k, on_v2=controls_v2))
    return spec


def auto_schedule(k: int, *, on_v2: bool) -> list[list[int]]:
    """The batch-size schedule ``SPECULATION_CONTROL=auto`` gives vLLM when the user gave none.

    vLLM's V1 runner runs any k up to the configured one under a schedule (piecewise graphs): one
    range, k, carried to every batch size. The V2 runner keeps its full CUDA graphs and captures
    them only for the query lengths of the schedule's k values (each for every capture size), so
    the schedule lists each k from the configured one down to 0, one batch size each:
    ``1-1:4,2-2:3,3-3:2,4-4:1,5+:0`` for k = 4. vLLM reads it for its graphs only; the worker's
    controller, which answers vLLM's per-step lookup, takes it for the list of runnable k values,
    not as a ceiling by batch size (:func:`is_graph_schedule`). Why every k, and the 0:
    docs/speculation.md, "The schedule under auto".
    """
    if not on_v2:
        return [[1, 1, k]]
    return [[i, i, k + 1 - i] for i in range(1, k + 2)]


def is_graph_schedule(schedule: object, k: int) -> bool:
    """Whether a schedule vLLM runs is the one :func:`auto_schedule` makes for V2 with ``k``: a
    list of the k values to capture graphs for, where a user's schedule is a ceiling by batch size."""
    return isinstance(schedule, list | tuple) and [list(entry) for entry in schedule] == auto_schedule(k, on_v2=True)
