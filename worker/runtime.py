"""The lazily booted engine, shared by every request of a process.

``EngineHolder.get()`` boots the engine on first use, inside the running event loop,
exactly once however many requests arrive together. A failed boot is remembered: every
later request gets the same clear error at once (and the entrypoint asks to be replaced)
instead of retrying a boot that cannot succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from worker.config import DeploymentMode, Settings, load_settings
from worker.errors import ConfigError, EngineBootError, EngineDead, EngineNotReady, WorkerError
from worker.metrics import WatchdogWindow, WorkerMetrics
from worker.schema import GenerateRequest, Served, StreamChunk

if TYPE_CHECKING:
    from worker.boot.plan import BootPlan
    from worker.engine import Engine
    from worker.openai import OpenAIServer
    from worker.speculation.stats.tracking import RequestEnd

__all__ = ["EngineHolder", "EngineProtocol", "EngineState", "boot_engine", "import_boot"]

log = logging.getLogger(__name__)

EngineState = Literal["idle", "booting", "ready", "failed", "dead"]


async def boot_engine(settings: Settings, *, mode: DeploymentMode) -> Engine:
    """vLLM's engine for ``settings``: the boot plan, what runs while vLLM is imported
    (:func:`worker.boot.prefetch.prepare_boot`), then the boot."""
    from worker.boot.plan import build_plan
    from worker.boot.prefetch import prepare_boot

    plan = build_plan(settings, mode=mode)
    prepare_boot(plan)
    started = time.perf_counter()
    boot = import_boot()
    # The boot's stamps (this line, the config's, vLLM's own) split the main process's time.
    log.info("vLLM imported in %.2f s", time.perf_counter() - started)
    return await boot(plan)


def import_boot() -> Callable[[BootPlan], Awaitable[Engine]]:
    """``worker.boot.launch.boot``, which imports vLLM (once a process). A vLLM without what the seam
    imports fails here, naming what it lacks; the import runs without the garbage collector, which
    would walk its growing heap again and again (``worker.boot.heap.imports_uncollected``)."""
    from worker.boot.heap import imports_uncollected
    from worker.vllm_internals.check import loud_imports

    with loud_imports(), imports_uncollected():
        from worker.boot.launch import boot
    return boot


class EngineProtocol(Protocol):
    """What the entrypoints use of an engine: ``worker.engine.Engine``, and the tests' ``FakeEngine``."""

    served: Served
    max_num_seqs: int
    observers: list[Callable[[RequestEnd], None]]

    @property
    def is_dead(self) -> bool: ...

    @property
    def num_unfinished_requests(self) -> int: ...

    def generate(
        self, request: GenerateRequest, *, request_id: str | None = None
    ) -> AsyncGenerator[StreamChunk, None]: ...

    def shutdown(self) -> None: ...

    def mark_dead(self) -> None: ...


class EngineHolder:
    def __init__(
        self,
        *,
        settings_loader: Callable[[], Settings] = load_settings,
        mode: DeploymentMode = "serverless",
        engine_factory: Callable[[Settings], Awaitable[EngineProtocol]] | None = None,
        shared_window: WatchdogWindow | None = None,
    ) -> None:
        """``engine_factory`` replaces vLLM's engine boot (tests, benchmarks that share one engine,
        an API process of a pod that connects to its engine core); ``shared_window``: the acceptance
        watchdog's window shared with the pod's other API processes."""
        self._shared_window = shared_window
        self._settings_loader = settings_loader
        self._mode: DeploymentMode = mode
        self._engine_factory = engine_factory
        self._settings: Settings | None = None
        self._settings_error: ConfigError | None = None
        self._engine: EngineProtocol | None = None
        self._boot_error: WorkerError | None = None
        self._lock: asyncio.Lock | None = None
        self._is_booting = False
        self._openai: OpenAIServer | None = None
        self.boot_seconds: float | None = None
        self.metrics: WorkerMetrics | None = None

    @property
    def settings(self) -> Settings:
        """Parsed once; raises :class:`ConfigError` naming the bad variable. A refusal is kept too:
        the environment does not change under a running process, and the SDK's concurrency modifier
        asks every tick, which would log the same warnings again each time."""
        if self._settings_error is not None:  # a new one each time: a re-raise would grow its traceback
            raise ConfigError(self._settings_error.message, param=self._settings_error.param)
        if self._settings is None:
            try:
                self._settings = self._settings_loader()
            except ConfigError as exc:
                self._settings_error = exc
                raise
        return self._settings

    @property
    def engine(self) -> EngineProtocol | None:
        """The engine if booted, else None (never boots)."""
        return self._engine

    @property
    def state(self) -> EngineState:
        if self._boot_error is not None:
            return "failed"
        if self._engine is not None:
            return "dead" if self._engine.is_dead else "ready"
        return "booting" if self._is_booting else "idle"

    @property
    def boot_error(self) -> WorkerError | None:
        return self._boot_error

    async def get(self) -> EngineProtocol:
        if self._engine is not None:
            if self._engine.is_dead:
                raise EngineDead("the inference engine has died")
            return self._engine
        if self._boot_error is not None:
            raise self._boot_error
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._engine is not None:
                return self._engine
            if self._boot_error is not None:
                raise self._boot_error
            self._is_booting = True
            started = time.perf_counter()
            try:
                settings = self.settings
                log.info("booting engine for model %s", settings.target_ref)
                engine = await self._boot(settings)
                self._engine = engine
            except WorkerError as exc:
                self._boot_error = self._setting_at_fault(exc) or exc
                log.error("engine boot failed: %s", self._boot_error.message)
                if self._boot_error is exc:
                    raise
                raise self._boot_error from exc
            except Exception as exc:
                self._boot_error = self._setting_at_fault(exc) or EngineBootError(
                    f"engine failed to start: {type(exc).__name__}: {exc}"
                )
                log.exception("engine boot failed")
                raise self._boot_error from exc
            finally:
                self._is_booting = False
            self.boot_seconds = time.perf_counter() - started
            log.info("engine ready in %.1f s", self.boot_seconds)
            self.metrics = WorkerMetrics(
                num_spec_tokens=engine.served.num_speculative_tokens,
                threshold=settings.acceptance_watchdog_threshold,
                window=settings.acceptance_watchdog_window,
                shared_window=self._shared_window,
            )
            self.metrics.count_in_engine(lambda: engine.num_unfinished_requests)
            engine.observers.append(self.metrics.observe)
            return engine

    def _setting_at_fault(self, exc: BaseException) -> ConfigError | None:
        """After a failed boot, the setting the files it fetched show to be wrong, if any
        (:func:`worker.boot.preflight.explain_boot_failure`): vLLM's own error does not name it."""
        if isinstance(exc, ConfigError):  # the settings' own, or one the boot named already
            return None
        from worker.boot.preflight import explain_boot_failure

        return explain_boot_failure(self.settings)

    async def _boot(self, settings: Settings) -> EngineProtocol:
        if self._engine_factory is not None:
            return await self._engine_factory(settings)
        return await boot_engine(settings, mode=self._mode)

    async def openai(self) -> OpenAIServer:
        """vLLM's OpenAI app over the engine, built once after the engine boots."""
        engine = await self.get()
        if self._openai is None:
            assert self._lock is not None  # get() made it
            async with self._lock:
                if self._openai is None:
                    from worker.engine import Engine
                    from worker.openai import OpenAIServer

                    if not isinstance(engine, Engine):
                        raise EngineNotReady("the OpenAI routes need vLLM's engine")
                    self._openai = await OpenAIServer.create(engine, self.settings)
        return self._openai

    def ready_engine(self) -> EngineProtocol:
        """The engine if it can serve now; otherwise the error saying why not (never waits)."""
        if self._boot_error is not None:
            raise self._boot_error
        if self._engine is None:
            raise EngineNotReady("the engine is still starting; retry shortly")
        if self._engine.is_dead:
            raise EngineDead("the inference engine has died")
        return self._engine

    def shutdown(self) -> None:
        self._openai = None
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:
                log.exception("engine shutdown failed")

    def install_signal_handlers(self) -> None:
        """Shut the engine down on SIGTERM/SIGINT so no engine-core process is orphaned."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)

            def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
                if self._is_booting:
                    self._exit_during_boot(signum)
                log.info("signal %d: shutting the engine down", signum)
                self.shutdown()
                if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
                    previous(signum, frame)
                else:
                    sys.exit(128 + signum)

            signal.signal(sig, handler)

    def _exit_during_boot(self, signum: int) -> None:
        """A signal while the engine boots ends the process now. The boot runs in a thread that no
        signal interrupts (a download, the hub client's retries of a file it cannot fetch), and a
        normal exit would wait for that thread to finish, as long as its retries last. The processes
        the boot has started so far (an engine core) are ended first, so that none is left behind."""
        import psutil

        log.info("signal %d during the engine's boot: ending its processes and exiting", signum)
        children = psutil.Process().children(recursive=True)
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.terminate()
        _, alive = psutil.wait_procs(children, timeout=5)
        for child in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        logging.shutdown()
        os._exit(128 + signum)
