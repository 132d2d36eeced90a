"""The boot plan: every decision a boot makes from the settings, made once, before vLLM is imported.

``build_plan(settings, mode=...)`` first decides speculation and CUDA graphs, once
(``worker.speculation.decide``: the control, the runner, torch.compile or not, the graph mode, k
and its schedule, and whether the worker's exact stats path runs), then builds vLLM's engine
arguments and the process environment the engine must inherit (with the start method of its
processes) from those answers, and last resolves the model references (each once: RunPod's model
cache, local paths, the embedded tiny models). Every step of the boot receives the plan
(``prefetch``, ``modelinfo``, ``launch``, the engine) and none of them asks the settings or the
environment again. Pure but for the tiny models, which the resolution builds offline on first use.
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
from worker.schema import Served
from worker.speculation.decide import SpeculationPlan, decide

__all__ = ["BootPlan", "ModelRef", "build_plan", "served_line"]


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
    speculation: SpeculationPlan  # control, runner, compile, CUDA graphs, k, schedule, exact stats (decide.py)
    lora_paths: dict[str, str]  # adapter name -> what vLLM loads, in configuration order
    model_info_dir: Path  # where vLLM keeps its model-class answers (modelinfo.py)

    @property
    def local_paths(self) -> list[Path]:
        """Where the target and a separate draft are on this machine, for the work done before vLLM
        is imported (reading weights, inspecting the model's class). A hub id that is not in
        RunPod's cache stays a hub id: a path that does not exist, which the callers skip."""
        return [Path(ref.path).expanduser() for ref in (self.target, self.draft) if ref is not None]

    def served(
        self, *, quantization: str | None, speculative_method: str | None, num_speculative_tokens: int | None
    ) -> Served:
        """The job's ``served`` block (and the pod's ``/plan``): the plan's decisions, with what
        only vLLM's config knows once built (the checkpoint's quantization, the method it runs)."""
        return Served(
            model=self.target.label,
            quantization=quantization,
            speculative_method=speculative_method,
            num_speculative_tokens=num_speculative_tokens,
            **self.speculation.shown(),
        )

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
    speculation = decide(settings, mode=mode, is_cpu=is_cpu)
    named = build_engine_kwargs(settings, speculation, is_cpu=is_cpu)
    environment = engine_environment(settings, speculation, mode=mode)
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
        speculation=speculation,
        lora_paths=references.lora_paths,
        model_info_dir=model_info_dir,
    )


def served_line(served: Served) -> str:
    """The boot's one log line of what serves: every field of the ``served`` block, as ``key=value``."""
    return "serving: " + ", ".join(f"{key}={value}" for key, value in served.model_dump(mode="json").items())
