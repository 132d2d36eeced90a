"""Pod mode over several API server processes: ``API_SERVER_COUNT`` > 1.

At high concurrency one Python process turning engine outputs into HTTP chunks is what limits a
pod (docs/gpu-results/HISTORY.md, "One API process at high concurrency"). vLLM's server answers with
``vllm serve --api-server-count N``: N API processes accept on one listening socket and talk to
one engine core over ZeroMQ, each as its own client. This module runs that machinery of vLLM's, as its
``vllm/entrypoints/cli/serve.py`` (``run_multi_api_server``) does (the seam's
``worker.vllm_internals.api_processes`` starts, watches and stops the processes), with the worker's
own app in every API process instead of vLLM's:

- this process is handed the listening socket (bound before anything boots, ``worker/cli.py``),
  starts the weight prefetch, sets the engine's environment, starts the engine core (with the
  worker's stats scheduler) and the N API processes, then watches them;
- each API process connects vLLM's ``AsyncLLM`` to the engine core as client i of N and serves
  the pod app (``worker/pod.py``: the API key, body limit, back-pressure, ``/health``, ``/metrics``,
  vLLM's OpenAI layer) with vLLM's uvicorn server class, which accepts each new connection in the
  least loaded process.

What the processes share, allocated here: the requests in flight, which the gate's back-pressure
sums over all processes (vLLM's count, through the seam); the acceptance watchdog's window
(``WatchdogWindow.shared``); and Prometheus's files (``PROMETHEUS_MULTIPROC_DIR``, set as vLLM
sets it), so that ``/metrics`` on any process shows every process's requests, summed.

Shutdown: SIGTERM (or SIGINT) here stops each API process, which drains its requests (uvicorn's
graceful shutdown, ``SHUTDOWN_GRACE_S``), then the engine core. If the engine core dies, each API
process answers 503 and exits with status 1 (``worker/pod.py``); this process then stops what is
left and exits with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import MutableSequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from worker.config import Settings, num_api_servers
from worker.errors import WorkerError
from worker.metrics import WatchdogWindow

if TYPE_CHECKING:
    from worker.boot.plan import BootPlan

__all__ = ["run_api_process", "serve"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Shared:
    """Shared memory of the pod's API processes, handed to each when it is spawned."""

    in_flight: MutableSequence[int]  # the slots of vLLM's count of requests in flight
    window: WatchdogWindow
    ready: MutableSequence[int]  # 1 in slot i once API process i has booted


@dataclasses.dataclass(frozen=True)
class _ReadySlots:
    """``worker.pod.ReadyPeers`` over the shared slots: each process writes only its own slot."""

    slots: MutableSequence[int]
    index: int

    @property
    def count(self) -> int:
        return len(self.slots)

    def mark_ready(self) -> None:
        self.slots[self.index] = 1

    def num_ready(self) -> int:
        return sum(self.slots)


def serve(settings: Settings, *, sock: socket.socket) -> int:
    """Run the pod with ``num_api_servers(settings)`` API processes on ``sock`` (bound before
    anything boots: ``worker.pod.listen_socket``); the exit status."""
    from worker.boot.plan import build_plan
    from worker.boot.prefetch import prepare_boot

    plan = build_plan(settings, mode="pod")
    prepare_boot(plan)  # before vLLM is imported
    from worker.vllm_internals.check import loud_imports

    with loud_imports():  # a vLLM without the machinery below fails here, naming what it lacks
        from worker.boot.launch import build_config
        from worker.vllm_internals.api_processes import (
            EngineAndApiProcesses,
            admission_counters,
            set_ulimit,
            setup_multiprocess_prometheus,
        )
    from worker.errors import one_line
    from worker.pod import FATAL_EXIT_DELAY_S

    count = num_api_servers(settings)
    # Before any API process starts: they inherit the directory and keep their metrics in it.
    setup_multiprocess_prometheus()  # type: ignore[no-untyped-call]
    try:
        vllm_config = build_config(plan, api_process_count=count, api_process_rank=-1)
    except WorkerError as exc:
        log.error("engine boot failed: %s", exc.message)
        return 1
    except Exception as exc:
        log.error("engine boot failed: %s", one_line(exc))
        return 1

    is_stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal is_stopping
        if not is_stopping:
            is_stopping = True
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    set_ulimit()  # as vLLM's server does: many connections per process
    context = multiprocessing.get_context("spawn")
    shared = _Shared(
        in_flight=admission_counters(count, context),
        window=WatchdogWindow.shared(settings.acceptance_watchdog_window, context),
        ready=context.RawArray("b", count),
    )
    processes = EngineAndApiProcesses()
    status = 0
    log.info("pod on http://%s:%d with %d API server processes", settings.host, settings.port, count)
    try:
        processes.start(
            vllm_config,
            count=count,
            target=run_api_process,
            listen_address=f"http://{settings.host}:{settings.port}",
            sock=sock,
            args=argparse.Namespace(plan=plan, shared=shared),
        )
        processes.wait()
    except SystemExit:
        log.info("stopping: draining the API processes (up to %.0f s), then the engine", settings.shutdown_grace_s)
    except Exception as exc:
        status = 1
        log.error("pod failed: %s; exiting with status 1 so that the pod is restarted", exc)
        # The API processes' clients are not told of an engine core that was killed: this process
        # tells them (SIGUSR1), they fail their requests in flight, answer 503 for a moment, then
        # exit by themselves (worker/pod.py).
        for proc in processes.api_processes:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + FATAL_EXIT_DELAY_S + 5
        for proc in processes.api_processes:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        processes.shutdown(api_timeout_s=settings.shutdown_grace_s + 5)
        sock.close()
    return status


def run_api_process(listen_address: str, sock: socket.socket, args: argparse.Namespace, client: dict[str, Any]) -> None:
    """One API process (the target vLLM's ``APIServerProcessManager`` spawns): the pod app over
    an ``AsyncLLM`` that is client ``client_index`` of the engine core."""
    import uvloop

    from worker.vllm_internals.api_processes import decorate_logs, set_process_title

    plan: BootPlan = args.plan
    settings = plan.settings
    set_process_title("APIServer", str(client["client_index"]))
    decorate_logs()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvloop.run(_serve_api_process(sock, plan, args.shared, dict(client)))


async def _serve_api_process(sock: socket.socket, plan: BootPlan, shared: _Shared, client: dict[str, Any]) -> None:
    import uvicorn

    from worker.boot.launch import ApiProcess, boot
    from worker.pod import create_app
    from worker.runtime import EngineHolder
    from worker.vllm_internals.api_processes import NoSignalServer, admission_stats

    loads = client.pop("api_server_loads", None)
    count, index = client.pop("client_count"), client.pop("client_index")
    api_process = ApiProcess(addresses=client, count=count, index=index)
    settings = plan.settings
    holder = EngineHolder(
        settings_loader=lambda: settings,
        mode="pod",
        engine_factory=lambda _: boot(plan, api_process=api_process),
        shared_window=shared.window,
    )
    peers = admission_stats(shared.in_flight, count=count, index=index)
    app = create_app(holder, peers=peers, ready_peers=_ReadySlots(shared.ready, index))
    config = uvicorn.Config(
        app,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    server = NoSignalServer(config, peer_loads=None if loads is None else (loads, index))

    def stop() -> None:
        server.should_exit = True

    def engine_died() -> None:  # from the pod's first process (serve), which watches the engine core
        engine = holder.engine
        if engine is not None:
            engine.mark_dead()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGUSR1, engine_died)
    await server.serve(sockets=[sock])
