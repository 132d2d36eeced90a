"""What speculation and the compiled graphs need from the settings, decided once: :func:`decide`
returns a :class:`SpeculationPlan`, which the boot plan stores (``BootPlan.speculation``) and
every later step reads instead of asking again.

On a GPU the worker runs vLLM's V2 runner, always: vLLM 0.34, the image's, has no other (how the
installed release is told so is the seam's: ``worker.vllm_internals.runner``); the CPU build runs
its CPU runner. The ``auto`` values depend on one another: ``SPECULATION_CONTROL=auto`` gives a
drafter the worker's FULL graph mode, and a compile-free engine runs FULL graphs too. So
:func:`decide` answers in one order, each answer from those before it and never from a later one:
the facts that depend on no ``auto`` (eager mode, full graphs, the worker's scheduler, the
drafter), then the control, then torch.compile, then the graph mode and capture size, then vLLM's
speculative config. Why each default is what it is, with the runs behind it, and the whole
decision table: docs/speculation.md (``tests/test_speculation_decide.py`` walks that table through
:func:`decide`). Reads only the settings: imports without vLLM.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from worker.config import DeploymentMode, Settings
from worker.config.speculation import Drafter

__all__ = [
    "AUTO_BY_DEFAULT",
    "JOIN_CAPTURE_TOKENS",
    "LATENCY_BOUND_MAX_NUM_SEQS",
    "ModelRunner",
    "SpeculationControl",
    "SpeculationPlan",
    "auto_schedule",
    "decide",
    "is_graph_schedule",
]

SpeculationControl = Literal["auto", "static"]
ModelRunner = Literal["v2", "cpu"]  # vLLM's V2 GPU runner, or the CPU build's runner

# SPECULATION_CONTROL's default by drafter, where the worker's controller can run (a GPU, a model
# of the user's, the worker's scheduler, full CUDA graphs for the target): auto only where the GPU
# map measured it at or above the static choice, else static. The one place a default changes
# when a map is measured (docs/speculation.md, "SPECULATION_CONTROL", says why for each).
AUTO_BY_DEFAULT: dict[Drafter, bool] = {
    "ngram": True,  # measured on the V2 runner
    "eagle": True,  # vLLM 0.34's map: auto above static k beside it at every load, no engine lost
    "draft_model": True,  # vLLM 0.34's map: auto at or above static k at every load and acceptance
    "other": False,  # MTP, suffix, ...: never measured
}

# The largest step (tokens) given a full CUDA graph where the worker chooses FULL for a drafter
# under the compiled engine: 256 sequences at k = 3, or 128 at k = 4 with prompts joining, which
# vLLM's own bound on Hopper, min(2 * max_num_seqs * (1 + k), 512), would leave without a graph.
JOIN_CAPTURE_TOKENS = 1024

# A pod whose MAX_NUM_SEQS is at most this serves latency-bound batches: compile-free FULL graphs,
# as serverless, under TORCH_COMPILE=auto. The bound is where the compile-free engine's decode
# stayed as close to the compiled one's as the cold-start issue allowed for the trade (it falls
# further behind from 64 streams on); why: docs/speculation.md, "TORCH_COMPILE"; figures:
# docs/benchmarks.md.
LATENCY_BOUND_MAX_NUM_SEQS = 32

# vLLM's CompilationMode.NONE: no torch.compile (its compilation_config's "mode").
_NO_COMPILE = 0


@dataclasses.dataclass(frozen=True, slots=True)
class SpeculationPlan:
    """Everything the boot needs about speculation, compilation and CUDA graphs, decided by
    :func:`decide`. ``speculative_config`` is a plain dict (the plan crosses into the pod's API
    processes): callers copy it."""

    control: SpeculationControl  # SPECULATION_CONTROL, or its default
    model_runner: ModelRunner  # V2 on every GPU; the CPU build's runner on its CPU
    is_eager: bool  # no compilation, no CUDA graphs (ENFORCE_EAGER, or the tiny model)
    has_cuda_graphs: bool  # a GPU, and not eager (by the settings or ENGINE_ARGS)
    is_torch_compiled: bool | None  # vLLM's torch.compile (its default mode); None: the CPU build's own choice
    cudagraph_mode: str | None  # vLLM's cudagraph_mode as given to it; None: vLLM's own (or none: eager)
    max_cudagraph_capture_size: int | None  # None: vLLM's own
    is_worker_full_graphs: bool  # FULL chosen by the worker: its plugin adds decode graphs, vLLM's config marked
    speculative_config: dict[str, Any] | None  # vLLM's, as the worker builds it (ENGINE_ARGS may replace it)
    is_exact_stats: bool  # the worker's scheduler and output processor: exact per-request stats
    # SKIP_DRAFT_PASS, a draft model, a GPU: no draft pass on a step that drafts nothing, its KV caught
    # up when drafting resumes (worker.vllm_internals.draft_skip; vLLM 0.34's V2 runner, where the seam has it).
    skips_draft_pass: bool = False

    @property
    def schedule(self) -> list[list[int]] | None:
        """vLLM's batch-size schedule of k (``[start, end, k]`` ranges): the user's, or ``auto``'s."""
        schedule = (self.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
        return [list(entry) for entry in schedule] if schedule is not None else None

    @property
    def compilation_config(self) -> dict[str, Any] | None:
        """vLLM's ``compilation_config`` for these choices; None: vLLM's own. ``mode`` 0 (no
        torch.compile) only on a GPU engine that is not eager (vLLM's eager mode sets it itself)."""
        is_compile_free = self.has_cuda_graphs and self.is_torch_compiled is False
        config = {
            "mode": _NO_COMPILE if is_compile_free else None,
            "cudagraph_mode": self.cudagraph_mode,
            "max_cudagraph_capture_size": self.max_cudagraph_capture_size,
        }
        return {key: value for key, value in config.items() if value is not None} or None

    def shown(self) -> dict[str, Any]:
        """The decisions as the job's ``served`` block, the pod's ``/plan`` and the boot's log line
        show them: ``null`` for a graph mode left to vLLM, for torch.compile left to the CPU build,
        and for a control without speculation."""
        return {
            "speculation_control": self.control if self.speculative_config is not None else None,
            "model_runner": self.model_runner,
            "cudagraph_mode": self.cudagraph_mode if self.has_cuda_graphs else "NONE",
            "torch_compile": self.is_torch_compiled,
            "speculative_tokens_by_batch": self.schedule,
            "spec_decode_available": self.is_exact_stats,
        }


def decide(settings: Settings, *, mode: DeploymentMode, is_cpu: bool) -> SpeculationPlan:
    """The plan for ``settings`` in ``mode`` on vLLM's CPU build (``is_cpu``) or a GPU. One pass,
    each answer from the ones before it (module docstring; the table: docs/speculation.md)."""
    engine_args = settings.engine_args or {}
    spec = settings.resolved_speculative_config
    # Facts no auto value depends on.
    # An embedded model runs eager on the CPU build, where it boots faster uncompiled; on a GPU it gets
    # CUDA graphs like any model: eager, SmolLM2's steps were bound by the host (docs/benchmarks.md).
    is_eager = settings.enforce_eager or (settings.is_tiny_default and is_cpu)
    is_eager_any = is_eager or bool(engine_args.get("enforce_eager"))
    has_cuda_graphs = not is_cpu and not is_eager_any
    # Full CUDA graphs for the target, which V2 keeps under a schedule.
    has_full_graphs = has_cuda_graphs and settings.cudagraph_mode not in ("NONE", "PIECEWISE")
    # The worker's scheduler (exact stats, and the controller under auto): not turned off, not replaced.
    runs_worker_scheduler = settings.per_request_spec_decode_metrics != "none" and "scheduler_cls" not in engine_args
    drafter = settings.drafter

    control = _control(
        settings,
        drafter=drafter,
        can_control=not is_cpu and not settings.is_tiny_default and runs_worker_scheduler and has_full_graphs,
    )
    is_compiled = _torch_compile(settings, mode=mode, is_cpu=is_cpu, is_eager=is_eager_any)
    # The worker's FULL: a drafter under auto (a step a request joins replays a full graph too), or
    # a compile-free engine (vLLM's piecewise graphs are compiled: full graphs or none).
    is_controlled = control == "auto" and runs_worker_scheduler and drafter != "other"
    is_worker_full_graphs = (
        settings.cudagraph_mode == "auto" and has_full_graphs and (is_controlled or is_compiled is False)
    )
    cudagraph_mode, capture = _graphs(
        settings,
        mode=mode,
        is_captured=has_cuda_graphs,
        is_full=is_worker_full_graphs,
        is_compiled=is_compiled is not False,
        admitted_tokens=_admitted_tokens(settings, mode=mode, spec=spec),
        speculates=spec is not None,
    )
    if spec is not None:
        spec = _speculative_config(
            spec,
            is_ngram=drafter == "ngram",
            on_gpu=not is_cpu,
            control=control,
            controls_v2=not is_cpu and runs_worker_scheduler,
        )
    # Exact stats wherever the engine speculates (ENGINE_ARGS' config included) under the worker's scheduler.
    speculates = engine_args.get("speculative_config", spec) is not None
    return SpeculationPlan(
        control=control,
        model_runner="cpu" if is_cpu else "v2",
        is_eager=is_eager,
        has_cuda_graphs=has_cuda_graphs,
        is_torch_compiled=is_compiled,
        cudagraph_mode=cudagraph_mode,
        max_cudagraph_capture_size=capture,
        is_worker_full_graphs=is_worker_full_graphs,
        speculative_config=spec,
        is_exact_stats=speculates and runs_worker_scheduler,
        skips_draft_pass=settings.skip_draft_pass and not is_cpu and drafter == "draft_model" and spec is not None,
    )


def _control(settings: Settings, *, drafter: Drafter, can_control: bool) -> SpeculationControl:
    """``SPECULATION_CONTROL``, or its default: ``auto`` where the worker's controller can run
    (``can_control``) for a drafter whose map measured it to pay (:data:`AUTO_BY_DEFAULT`);
    ``static`` elsewhere (docs/speculation.md says why for each)."""
    if settings.speculation_control is not None:
        return settings.speculation_control
    return "auto" if can_control and AUTO_BY_DEFAULT[drafter] else "static"


def _torch_compile(settings: Settings, *, mode: DeploymentMode, is_cpu: bool, is_eager: bool) -> bool | None:
    """Whether vLLM compiles the model with torch.compile (its default mode) or runs it uncompiled
    with full CUDA graphs only; None: the CPU build's own choice, as before this setting.

    ``TORCH_COMPILE=auto``: compile-free where serving is latency-bound, serverless and a pod of at
    most :data:`LATENCY_BOUND_MAX_NUM_SEQS` sequences, since torch.compile costs every boot on an
    empty cache root (a new serverless worker without a network volume) far more than it gains a
    small batch; compiled where batches are large (pods), where it decodes faster. A graph mode
    with piecewise graphs needs the compiled engine (vLLM compiles those graphs). ``compilation_config``'s
    ``mode`` in ``ENGINE_ARGS`` is the user's last word, and shown as such; eager runs uncompiled."""
    users_mode = _users_compilation(settings).get("mode")
    if is_eager:
        return False
    if users_mode is not None:
        return users_mode not in (_NO_COMPILE, "NONE")
    if is_cpu:
        return None
    if settings.torch_compile != "auto":
        return settings.torch_compile == "on"
    users_graphs = _users_compilation(settings).get("cudagraph_mode", settings.cudagraph_mode)
    if users_graphs in ("PIECEWISE", "FULL_AND_PIECEWISE"):
        return True
    is_small_pod = settings.max_num_seqs is not None and settings.max_num_seqs <= LATENCY_BOUND_MAX_NUM_SEQS
    return not (mode == "serverless" or is_small_pod)


def _users_compilation(settings: Settings) -> dict[str, Any]:
    """``ENGINE_ARGS``' ``compilation_config``, whose keys win over the plan's (``engine_args.py``)."""
    config = (settings.engine_args or {}).get("compilation_config")
    return config if isinstance(config, dict) else {}


def _admitted_tokens(settings: Settings, *, mode: DeploymentMode, spec: dict[str, Any] | None) -> int | None:
    """The most tokens a decode step of this worker runs: the sequences it admits (serverless: the
    jobs it takes at once, ``MAX_CONCURRENCY``; the engine's ``MAX_NUM_SEQS`` either way), times
    ``1 + k`` with speculation. None where the settings do not say (vLLM's defaults decide)."""
    bounds = [settings.max_num_seqs, settings.max_concurrency if mode == "serverless" else None]
    known = [bound for bound in bounds if bound is not None]
    if not known:
        return None
    k = 0 if spec is None else spec.get("num_speculative_tokens")
    return min(known) * (1 + k) if isinstance(k, int) else None


def _graphs(
    settings: Settings,
    *,
    mode: DeploymentMode,
    is_captured: bool,
    is_full: bool,
    is_compiled: bool,
    admitted_tokens: int | None,
    speculates: bool,
) -> tuple[str | None, int | None]:
    """``CUDAGRAPH_MODE`` and ``MAX_CUDAGRAPH_CAPTURE_SIZE`` as given to vLLM (None: vLLM's own).

    ``auto`` keeps vLLM's mode (FULL_AND_PIECEWISE), but for the worker's FULL (``is_full``). A
    compile-free engine captures graphs up to the most tokens a decode step of this worker runs
    (``admitted_tokens``): a larger step, a prompt's, runs without one, as it would gain little.
    The compiled engine's FULL for a drafter under ``auto`` captures up to
    :data:`JOIN_CAPTURE_TOKENS`, so that a step a request joins replays a graph too. Under a mode
    without piecewise graphs a compiled serverless worker captures no decode batch larger than it
    takes jobs (``MAX_CONCURRENCY``); under vLLM's mode the capture sizes serve its piecewise graphs
    too, and with speculation a step is ``1 + k`` tokens a sequence: vLLM's sizes there. An eager
    engine, or the CPU build, captures nothing."""
    if not is_captured:
        return None, None
    cudagraph_mode = "FULL" if is_full else None if settings.cudagraph_mode == "auto" else settings.cudagraph_mode
    capture = settings.max_cudagraph_capture_size
    if not is_compiled and cudagraph_mode != "NONE":
        capture = capture or admitted_tokens
    elif is_full:
        capture = capture or JOIN_CAPTURE_TOKENS
    elif capture is None and mode == "serverless" and not speculates and cudagraph_mode in ("FULL_DECODE_ONLY", "FULL"):
        capture = settings.max_concurrency
    return cudagraph_mode, capture


def _speculative_config(
    spec: dict[str, Any], *, is_ngram: bool, on_gpu: bool, control: SpeculationControl, controls_v2: bool
) -> dict[str, Any]:
    """vLLM's speculative config for the decisions: n-gram on a GPU (V2) named ``ngram_gpu``, and
    under ``auto`` a batch-size schedule unless the user gave one.

    V2 drafts both n-gram names on the GPU, but vLLM keeps async scheduling only for the name
    ``ngram_gpu`` (under ``ngram`` every step waits for the host). The schedule is what lets vLLM
    change k per step, and the worker's scheduler answers its lookups (``controller.py``): on V2
    under the worker's controller every k from the configured one to 0, so that V2 captures full
    graphs for each; elsewhere (the CPU build's runner, or no controller) one range, the
    configured k (:func:`auto_schedule`)."""
    if is_ngram and on_gpu:
        spec = {key: value for key, value in spec.items() if key != "model"} | {"method": "ngram_gpu"}
    k = spec.get("num_speculative_tokens")
    if control == "auto" and isinstance(k, int) and k > 0:
        spec.setdefault("num_speculative_tokens_per_batch_size", auto_schedule(k, on_v2=controls_v2))
    return spec


def auto_schedule(k: int, *, on_v2: bool) -> list[list[int]]:
    """The batch-size schedule ``SPECULATION_CONTROL=auto`` gives vLLM when the user gave none.

    The V2 runner keeps its full CUDA graphs and captures them only for the query lengths of the
    schedule's k values (each for every capture size), so the schedule lists each k from the
    configured one down to 0, one batch size each: ``1-1:4,2-2:3,3-3:2,4-4:1,5+:0`` for k = 4.
    vLLM reads it for its graphs only; the worker's controller, which answers vLLM's per-step
    lookup, takes it for the list of runnable k values, not as a ceiling by batch size
    (:func:`is_graph_schedule`). Without V2's graphs under the controller (the CPU build's runner,
    which runs any k up to the configured one, or no controller to read the list): one range, k,
    carried to every batch size. Why every k, and the 0: docs/speculation.md, "The schedule under
    auto".
    """
    if not on_v2:
        return [[1, 1, k]]
    return [[i, i, k + 1 - i] for i in range(1, k + 2)]


def is_graph_schedule(schedule: object, k: int) -> bool:
    """Whether a schedule vLLM runs is the one :func:`auto_schedule` makes for V2 with ``k``: a
    list of the k values to capture graphs for, where a user's schedule is a ceiling by batch size."""
    return isinstance(schedule, list | tuple) and [list(entry) for entry in schedule] == auto_schedule(k, on_v2=True)
