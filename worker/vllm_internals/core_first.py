"""The engine core started before the frontend's renderer, so that the two build side by side.

``AsyncLLM.__init__`` builds its renderer (the tokenizer, loaded, then deep-copied into a thread
pool) before it forks the engine core, so on every boot that work, about a second in the main
process (docs/gpu-results/HISTORY.md, "The levers, and what each did"), runs in series with the
core's whole start, though the frontend needs the tokenizer only at the first request. vLLM has no
option for the other order, and its own multi-API-server launch (``launch_core_engines`` over
listeners bound first, the pod's ``api_processes``) is the only path that starts the core before any
frontend exists. This runs that path in one process:

1. :func:`start_core` binds the engine's listeners and forks the core through ``launch_core_engines``;
2. :meth:`CoreFirst.build_frontend` builds the renderer in a thread while this thread waits for the
   core's startup handshake, which raises, as it does inside ``AsyncLLM``, if the core dies first (a
   renderer that fails stops the core, so the boot fails at once, naming the renderer);
3. then builds ``AsyncLLM`` as a client of that core, over the listeners, with the renderer already
   built (the one name ``AsyncLLM.__init__`` calls for it answers with it, during this call only);
4. and hands the client the engine manager, so that vLLM's own monitor watches the core and the
   client's shutdown stops it, as when ``AsyncLLM`` starts the core itself.

The renderer is built only after the handshake would have failed, not while the client waits for the
core's ready message: that wait ends only at ``VLLM_ENGINE_READY_TIMEOUT_S``, so a core that died
would have held a failed boot that long.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

import vllm.v1.engine.async_llm as async_llm_module
from vllm.config import VllmConfig
from vllm.renderers import renderer_from_config
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
from vllm.v1.executor import Executor

from worker.errors import EngineBootError, one_line
from worker.vllm_internals.async_llm import client_kwargs

__all__ = ["CoreFirst", "start_core"]


class CoreFirst:
    """An engine core forked before its frontend exists; :meth:`build_frontend` builds the frontend."""

    def __init__(self, vllm_config: VllmConfig, *, log_stats: bool) -> None:
        self._vllm_config = vllm_config
        executor = Executor.get_class(vllm_config)
        self._bound_listeners = bind_engine_zmq_listeners(vllm_config, 1)
        self._launch_context = launch_core_engines(vllm_config, executor, log_stats, self._bound_listeners.addresses)
        self._is_handshake_over = False
        try:
            self._launch = self._launch_context.__enter__()  # forks the engine core
        except BaseException:
            self._bound_listeners.cleanup()
            raise

    def build_frontend(self, **kwargs: Any) -> AsyncLLM:
        """``AsyncLLM.from_vllm_config(vllm_config, **kwargs)`` as the core's client; on any failure
        the core is stopped and the listeners closed before the exception goes on. A renderer that
        cannot be built fails the boot with :class:`EngineBootError` naming it, at once (the core is
        stopped, which ends the handshake), not after the core's whole start."""
        built: dict[str, Any] = {}

        def build_renderer() -> None:
            try:
                built["renderer"] = renderer_from_config(self._vllm_config)
            except BaseException as exc:  # raised again on the boot's thread
                built["error"] = exc
                self._shut_down_core()

        renderer_thread = threading.Thread(target=build_renderer, name="worker-renderer", daemon=True)
        try:
            renderer_thread.start()
            try:
                self._launch_context.__exit__(None, None, None)  # the core's startup handshake
                self._is_handshake_over = True
            finally:
                renderer_thread.join()
                if "error" in built:  # the cause, ahead of the handshake's report of the core it stopped
                    error = built["error"]
                    raise EngineBootError(f"vLLM's renderer (tokenizer) failed: {one_line(error)}") from error
            llm = self._client(built["renderer"], **kwargs)
        except BaseException:
            self._stop()
            raise
        # From here the client owns the core: vLLM's monitor marks it dead if the core exits, and
        # the client's shutdown stops it (BackgroundResources), as for a core AsyncLLM started.
        llm.engine_core.resources.engine_manager = self._launch.engine_manager
        llm.engine_core.start_engine_core_monitor()
        # The listeners' paths stay until the client goes: the core may still connect its output
        # socket after its ready message (its own thread), and vLLM's listeners unlink their paths
        # when collected. vLLM's own launcher holds them for the processes' life too.
        weakref.finalize(llm.engine_core, self._bound_listeners.cleanup)
        return llm

    def _client(self, renderer: Any, **kwargs: Any) -> AsyncLLM:
        listeners = self._bound_listeners
        addresses = {
            "input_address": listeners.inputs[0].address,
            "output_address": listeners.outputs[0].address,
            "input_listener": listeners.inputs[0].socket,
            "output_listener": listeners.outputs[0].socket,
            "tensor_queue": self._launch.tensor_queue,
        }
        # AsyncLLM.__init__ asks this name for its renderer; during this call the one built beside
        # the core answers for this config (anything else still gets vLLM's own).
        own = async_llm_module.__dict__["renderer_from_config"]
        config = self._vllm_config

        def prebuilt(asked: Any, *args: Any, **options: Any) -> Any:
            return renderer if asked is config and not args and not options else own(asked, *args, **options)

        setattr(async_llm_module, "renderer_from_config", prebuilt)  # noqa: B010
        try:
            client = client_kwargs(addresses, count=1, index=0, usage_context=UsageContext.ENGINE_CONTEXT)
            return AsyncLLM.from_vllm_config(config, **client, **kwargs)
        finally:
            setattr(async_llm_module, "renderer_from_config", own)  # noqa: B010

    def _shut_down_core(self) -> None:
        if self._launch.engine_manager is not None:
            self._launch.engine_manager.shutdown()

    def _stop(self) -> None:
        self._shut_down_core()
        if not self._is_handshake_over:  # close vLLM's launch (its handshake socket) without waiting
            with contextlib.suppress(BaseException):
                self._launch_context.__exit__(EngineBootError, EngineBootError("boot stopped"), None)
        self._bound_listeners.cleanup()


def start_core(vllm_config: VllmConfig, *, log_stats: bool) -> CoreFirst:
    """Fork the engine core of ``vllm_config`` now (``launch_core_engines``, one core, no DP)."""
    return CoreFirst(vllm_config, log_stats=log_stats)
