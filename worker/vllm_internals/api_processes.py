"""vLLM's machinery for several API server processes over one engine core, as its
``vllm/entrypoints/cli/serve.py`` (``run_multi_api_server``) runs it; ``worker/api_servers.py`` runs
it with the worker's own app in every API process. None of it is vLLM's public surface: each name,
and what the worker calls it with, is in the seam's contract. Import this module only after the boot
plan's environment is set (it imports vLLM)."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable, MutableSequence, Sequence
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from vllm.config import VllmConfig
from vllm.entrypoints.launchers.launcher import NoSignalServer
from vllm.utils.system_utils import decorate_logs, set_process_title, set_ulimit
from vllm.v1.engine.admission_control import SharedAdmissionStats
from vllm.v1.engine.utils import EngineZmqListeners, bind_engine_zmq_listeners, launch_core_engines
from vllm.v1.executor import Executor
from vllm.v1.metrics.prometheus import setup_multiprocess_prometheus
from vllm.v1.utils import APIServerProcessManager, wait_for_completion_or_failure

__all__ = [
    "EngineAndApiProcesses",
    "NoSignalServer",
    "admission_counters",
    "admission_stats",
    "decorate_logs",
    "set_process_title",
    "set_ulimit",
    "setup_multiprocess_prometheus",
]


def admission_counters(count: int, context: SpawnContext) -> MutableSequence[int]:
    """Shared memory for vLLM's count of the requests in flight over ``count`` API processes
    (``SharedAdmissionStats``'s slots), allocated before they are spawned."""
    counters: MutableSequence[int] = context.RawArray("q", SharedAdmissionStats.num_counters(count))
    return counters


def admission_stats(counters: MutableSequence[int], *, count: int, index: int) -> SharedAdmissionStats:
    """API process ``index``'s view of the requests in flight over all ``count`` processes (what the
    pod's back-pressure sums), over the slots :func:`admission_counters` allocated."""
    return SharedAdmissionStats({"mp_admission_counters": counters}, count, index)


class EngineAndApiProcesses:
    """The engine core and the API processes, started, watched and stopped as vLLM's
    ``run_multi_api_server`` does. What :meth:`start` got as far as starting is stopped by
    :meth:`shutdown`, whatever failed after."""

    def __init__(self) -> None:
        self._manager: APIServerProcessManager | None = None
        self._engines: Any = None  # vLLM's engine core manager (its type varies with the launch)
        # The engine's ZMQ listeners, held open for the processes' life, as vLLM's
        # run_multi_api_server holds them (a local of its whole function): an API process adopts
        # its listener when it starts, which can be after start() returns; dropped with the last
        # reference, the listening sockets closed under a late API process, and it waited for the
        # engine core's handshake forever.
        self._zmq_listeners: EngineZmqListeners | None = None

    def start(
        self,
        vllm_config: VllmConfig,
        *,
        count: int,
        target: Callable[..., None],
        listen_address: str,
        sock: socket.socket,
        args: argparse.Namespace,
    ) -> None:
        """Start the engine core and ``count`` API processes running ``target`` on ``sock``; returns
        once the engine core has answered its handshake."""
        listeners = self._zmq_listeners = bind_engine_zmq_listeners(vllm_config, count)
        executor = Executor.get_class(vllm_config)
        with launch_core_engines(vllm_config, executor, True, listeners.addresses) as launch:
            self._engines = launch.engine_manager
            coordinator = launch.coordinator
            self._manager = APIServerProcessManager(
                target_server_fn=target,
                listen_address=listen_address,
                sock=sock,
                args=args,
                num_servers=count,
                input_listeners=listeners.inputs,
                output_listeners=listeners.outputs,
                stats_update_address=coordinator.get_stats_publish_address() if coordinator else None,
                tensor_queue=launch.tensor_queue,
            )
            # vLLM's launcher watches these while it waits for the engine core's handshake: an API
            # process that dies first fails the launch instead of leaving it waiting.
            launch.watched_frontend_processes = self._manager.processes

    def wait(self) -> None:
        """Until a process ends: an API process's or the engine core's death raises."""
        if self._manager is None:
            raise RuntimeError("wait() before start(): no processes to watch")
        wait_for_completion_or_failure(api_server_manager=self._manager, engine_manager=self._engines)

    @property
    def api_processes(self) -> Sequence[BaseProcess]:
        return () if self._manager is None else tuple(self._manager.processes)

    def shutdown(self, *, api_timeout_s: float) -> None:
        """Stop the API processes (each drains within ``api_timeout_s``), then the engine core with
        vLLM's own grace for it (5 s), as its server gives."""
        if self._manager is not None:
            self._manager.shutdown(timeout=api_timeout_s)
        if self._engines is not None:
            self._engines.shutdown(timeout=None)
        # Closed here, while the interpreter is whole: left to the object's __del__ at exit, vLLM's
        # cleanup ran with its module's globals gone ("Exception ignored in EngineZmqListeners.__del__").
        if self._zmq_listeners is not None:
            self._zmq_listeners.cleanup()
            self._zmq_listeners = None
