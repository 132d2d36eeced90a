"""Which model runner vLLM runs, as the installed release must be told: the process environment
that puts the worker on vLLM's V2 runner on a GPU and keeps the CPU build on its CPU runner.

The plan decides the runner once, without asking the release (``worker.speculation.decide``: V2
on every GPU, the CPU runner on the CPU build); how vLLM is told is a difference between releases,
hence here. vLLM 0.34, the image's, has only its V2 GPU runner and no ``VLLM_USE_V2_MODEL_RUNNER``:
nothing to set. vLLM 0.32, the CPU build's, still has both GPU runners and picks V1 where V2 lacks
a feature, so on a GPU it is told ``VLLM_USE_V2_MODEL_RUNNER=1``: 0.32 on a GPU runs what 0.34
runs. On the CPU build the variable is unset, whatever the environment held: its V2 runner needs
Triton, which the CPU build has not, and the CPU runner is what runs there. Reads the release from
the package metadata (``release.py``): imports without vLLM, before the boot plan imports it.
"""

from __future__ import annotations

from worker.vllm_internals.release import Release, installed_release

__all__ = ["V2_RUNNER_ENV", "runner_environment"]

# vLLM 0.32's switch between its GPU runners (an integer; non-zero: V2); gone in 0.34.
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def runner_environment(*, is_cpu: bool, release: Release | None = None) -> dict[str, str | None]:
    """The environment entries (``None``: unset it) that run vLLM's V2 runner on a GPU, or the CPU
    build's runner on its CPU, under ``release`` (default: the installed one)."""
    if (release or installed_release()) == "0.34":
        return {}
    return {V2_RUNNER_ENV: None if is_cpu else "1"}
