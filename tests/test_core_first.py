"""The engine core forked before the frontend's renderer (``worker/vllm_internals/core_first.py``), on the
real CPU engine: the client owns the core it did not start, and a failure after the fork stops the core."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest
import vllm.renderers
import vllm.v1.engine.async_llm as async_llm_module

from tests.helpers import boot_engine, descendants, engine_cores_of
from worker.errors import EngineBootError
from worker.vllm_internals import core_first

pytestmark = pytest.mark.slow  # every test here boots an engine core

# vLLM's client stops its core within its 5 s grace, and the tiny engine boots in 10-40 s here; both
# bounds allow for a loaded machine.
SHUTDOWN_S = 30.0
BOOT_S = 180.0


def stop_leftover_cores(before: set[int], *, wait_s: float = 30.0) -> set[int]:
    """The engine cores started since ``before`` that are still running after ``wait_s`` (a core
    stops within vLLM's 5 s grace), killed: else this process would wait for them at its exit."""
    deadline = time.monotonic() + wait_s
    while True:
        left = set(engine_cores_of(os.getpid())) - before
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


async def test_the_client_owns_the_core_it_did_not_start(tiny_models: Any) -> None:
    before = set(descendants(os.getpid()))
    try:
        # A core nobody owns is stopped when its launch's manager is collected, and without vLLM's monitor
        # the boot's warm-up request then waits on it for ever: bounded, as the shutdown below.
        engine = await asyncio.wait_for(
            boot_engine(tiny_models, MODEL_NAME="tiny:target", SPECULATIVE_METHOD="none"), BOOT_S
        )
    except TimeoutError:
        stop_leftover_cores(before, wait_s=0)
        pytest.fail(
            f"the boot did not end within {BOOT_S:.0f} s (an engine core stopped under a client that does not own it?)"
        )
    try:
        resources = engine.llm.engine_core.resources
        # vLLM's monitor and the client's shutdown act on the core only through this manager.
        assert resources.engine_manager is not None
        assert [proc.is_alive() for proc in resources.engine_manager.processes] == [True]
        # The renderer's name in AsyncLLM's module is vLLM's own again after the boot.
        assert async_llm_module.__dict__["renderer_from_config"] is vllm.renderers.renderer_from_config
        # A renderer built beside the core is the one the frontend uses.
        assert engine.llm.renderer.tokenizer is not None
    finally:
        # A client that does not own the core can wait on it for ever at shutdown: bounded here, so that
        # this test fails in about a minute instead of at the suite's timeout.
        stopper = threading.Thread(target=engine.shutdown, name="engine-shutdown", daemon=True)
        stopper.start()
        stopper.join(SHUTDOWN_S)
        left = stop_leftover_cores(before)
    assert not stopper.is_alive(), f"the client's shutdown did not return within {SHUTDOWN_S:.0f} s"
    assert not left, "the client's shutdown left the engine core running"


async def test_a_renderer_failure_after_the_fork_stops_the_core_and_names_the_cause(
    tiny_models: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fake failure: a tokenizer that vLLM's config accepts but its renderer cannot build is not
    # something the tiny models can produce on demand.
    def failing_renderer(_config: Any) -> None:
        raise RuntimeError("renderer failed (a fake failure)")

    monkeypatch.setattr(core_first, "renderer_from_config", failing_renderer)
    before = set(descendants(os.getpid()))
    with pytest.raises(EngineBootError, match=r"renderer failed \(a fake failure\)"):
        await boot_engine(tiny_models, MODEL_NAME="tiny:target", SPECULATIVE_METHOD="none")
    left = stop_leftover_cores(before)
    assert not left, "the failed boot left its engine core running"
    assert async_llm_module.__dict__["renderer_from_config"] is vllm.renderers.renderer_from_config
