"""The boot plan: every decision a boot makes from the settings, made once, before vLLM is imported.

``build_plan(settings, mode=...)`` builds vLLM's engine arguments, the process environment the
engine must inherit (with the start method of its processes), decides whether the worker's exact
stats path runs (its scheduler in the engine core, its output processor in the frontend), and
last resolves the model references (each once: RunPod's model cache, local paths, the embedded
tiny models). Every step of the boot receives the plan (``prefetch``, ``modelinfo``, ``launch``,
the engine) and none of them asks the settings or the environment again. Pure but for the tiny
models, which the resolution builds offline on first use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Literal

from worker.boot.engine_args import build_engine_kwargs, engine_environment, start_method
from worker.boot.models import ModelRef, resolve_references
from worker.config import DeploymentMode, Settings
from worker.config.host import is_cpu_build
from worker.speculation.decide import runs_worker_scheduler, speculation_control

__all__ = ["BootPlan", "ModelRef", "build_plan"]


@dataclasses.dataclass(frozen=True, slots=True)
class BootPlan:
    """What a boot does, decided once from ``settings``. Its mappings are not to be changed (a
    frozen value that crosses into the pod's API processes, so plain dicts: callers copy them)."""

    settings: Settings
    mode: DeploymentMode
    target: ModelRef
    draft: ModelRef | None  # a separate draft model (vLLM's method draft_model), else None
    engine_kwargs: dict[str, Any]  # vLLM's AsyncEngineArgs, model references resolved
    environment: dict[str, str | None]  # what the engine's processes must inherit (None: unset)
    start_method: Literal["fork", "spawn"]  # how vLLM starts its engine core (one of environment's)
    is_exact_stats: bool  # the worker's scheduler and output processor: exact per-request stats
    speculation_control: Literal["auto", "static"]  # SPECULATION_CONTROL, or its default (speculation/decide.py)
    lora_paths: dict[str, str]  # adapter name -> what vLLM loads, in configuration order
    model_info_dir: Path  # where vLLM keeps its model-class answers (modelinfo.py)

    @property
    def local_paths(self) -> list[Path]:
        """Where the target and a separate draft are on this machine, for the work done before vLLM
        is imported (reading weights, inspecting the model's class). A hub id that is not in
        RunPod's cache stays a hub id: a path that does not exist, which the callers skip."""
        return [Path(ref.path).expanduser() for ref in (self.target, self.draft) if ref is not None]

    def apply_environment(self, environ: MutableMapping[str, str]) -> None:
        """Write the plan's process environment into ``environ`` (the process's, before vLLM is
        imported; again after vLLM's config is built, which on the CPU sets its own start method)."""
        for key, value in self.environment.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value


def build_plan(settings: Settings, *, mode: DeploymentMode, is_cpu: bool | None = None) -> BootPlan:
    """The plan for ``settings`` in ``mode``. ``is_cpu``: the engine runs on vLLM's CPU build
    (default: the installed build's); ``lora_slots`` depends on it. The engine arguments are built
    with the references as named, then every reference is resolved in one step, last."""
    is_cpu = is_cpu_build() if is_cpu is None else is_cpu
    named = build_engine_kwargs(settings, is_cpu=is_cpu, mode=mode)
    # The one answer to "are exact stats on": speculation (from the settings or ENGINE_ARGS), not
    # turned off, and vLLM's scheduler not replaced through ENGINE_ARGS (the worker's scheduler is
    # what answers the frontend; with another one its processor would hold stop strings in vain).
    is_exact_stats = named.get("speculative_config") is not None and runs_worker_scheduler(settings)
    environment = engine_environment(settings, mode=mode, is_cpu=is_cpu)
    method = start_method(settings, mode=mode)
    model_info_dir = settings.vllm_cache_dir / "modelinfos"
    references = resolve_references(settings, named)
    return BootPlan(
        settings=settings,
        mode=mode,
        target=references.target,
        draft=references.draft,
        engine_kwargs=references.engine_kwargs,
        environment=environment,
        start_method=method,
        is_exact_stats=is_exact_stats,
        speculation_control=speculation_control(settings, mode=mode, is_cpu=is_cpu),
        lora_paths=references.lora_paths,
        model_info_dir=model_info_dir,
    )
