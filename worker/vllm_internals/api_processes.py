"""vLLM's machinery for several API server processes over one engine core, as its
``vllm/entrypoints/cli/serve.py`` (``run_multi_api_server``) runs it; ``worker/api_servers.py`` runs
it with the worker's own app in every API process. None of it is vLLM's public surface: each name,
and what the worker calls it with, is in the seam's contract. Import this module only after the boot
plan's environment is set (it imports vLLM)."""

from __future__ import annotations

from vllm.entrypoints.launchers.launcher import NoSignalServer
from vllm.utils.system_utils import decorate_logs, set_process_title, set_ulimit
from vllm.v1.engine.admission_control import SharedAdmissionStats
from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
from vllm.v1.executor import Executor
from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus
from vllm.v1.utils import APIServerProcessManager, wait_for_completion_or_failure

__all__ = [
    "APIServerProcessManager",
    "Executor",
    "NoSignalServer",
    "SharedAdmissionStats",
    "bind_engine_zmq_listeners",
    "decorate_logs",
    "launch_core_engines",
    "set_process_title",
    "set_ulimit",
    "setup_multiprocess_prometheus",
    "wait_for_completion_or_failure",
]
