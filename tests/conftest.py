"""Shared fixtures: the tiny models (built once per machine) and real CPU engines."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.helpers import CACHE_DIR, LORA_ENV, boot_engine
from worker.config import Settings
from worker.tiny_models import TinyModels, ensure_tiny_models

# The engines the tests boot share this machine's cores with each other. vLLM's CPU build binds
# every engine's model worker to the same core ("auto" binding: core 0 on a 2-core machine, core 1
# reserved), so engines running at once in the two test workers, and the subprocess servers, all
# computed on core 0: one chat request waited 147 s behind them in a full run (vLLM logged no free
# broadcast block for 60 s, twice). Unbound, with one thread each (what the binding gave them), the
# kernel spreads them: the full suite took 712 s instead of 895 s on a 2-core machine. Set before
# anything boots; servers inherit it through ``subprocess_env``.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Variables the worker reads; each test starts without them (engines get explicit settings).
_WORKER_ENV = {name.upper() for name in Settings.model_fields} | {"RUNPOD_WEBHOOK_GET_JOB"}


# Fixtures that boot an engine or a server: a test that asks for one must be marked slow, so
# that `pytest -m "not slow"` (the development lane) never boots anything.
_BOOTING_FIXTURES = {
    "default_engine",
    "plain_engine",
    "spec_engine",
    "both",
    "plain",
    "pod",
    "pod_and_worker",
    "awq_model",
    "vision",
    "readme_servers",
    "smollm2_engine",
}


# How pytest-xdist spreads the tests (pyproject's addopts run them in parallel): the modules whose
# tests use the session's engines run in one worker, so each engine boots once a run; a module with
# a module-scoped server or model runs in one worker; every other test goes wherever a worker is
# free. Named by module because xdist's scheduler sees node ids only (its own `xdist_group` marks
# do not reach it under pytest 9); the collection check below keeps these sets true.
_SESSION_ENGINES = {"default_engine", "plain_engine"}
_SESSION_ENGINE_MODULES = {
    "tests/test_engine_spec.py",
    "tests/test_fuzz.py",
    "tests/test_openai.py",
    "tests/test_pod.py",
    "tests/test_serverless.py",
}
_MODULE_GROUPED = {
    "tests/test_quantize.py",
    "tests/test_api_servers.py",
    "tests/test_vision.py",
    "tests/test_readme.py",
    "tests/test_smollm2.py",
}
# The modules whose tests take longest (minutes each: servers booted in subprocesses, a soak), in
# the order they are handed out, right after the session engines' group: longest first keeps the
# last worker from starting a three-minute test when the others are done. AWQ leads: on a fresh
# machine its fixture also builds .venv-quant (a pip install, then the quantization: ~5 minutes).
_LONGEST_FIRST = [
    "tests/test_quantize.py",
    "tests/test_soak.py",
    "tests/test_bench.py",
    "tests/test_reliability.py",
    "tests/test_api_servers.py",
    "tests/test_readme.py",
    "tests/test_smollm2.py",
    "tests/test_lossless.py",
    "tests/test_entrypoints.py",
]


def _rank(item: pytest.Item) -> int:
    """Where a test goes in the queue: the session engines' group, then slow tests longest first,
    then the rest (seconds each, they fill the gaps at the end)."""
    module = _module(item.nodeid)
    if module in _SESSION_ENGINE_MODULES:
        return 0
    if item.get_closest_marker("slow") is None:
        return len(_LONGEST_FIRST) + 2
    return 1 + _LONGEST_FIRST.index(module) if module in _LONGEST_FIRST else len(_LONGEST_FIRST) + 1


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked, ungrouped = [], []
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if _BOOTING_FIXTURES & used and item.get_closest_marker("slow") is None:
            unmarked.append(item.nodeid)
        module = _module(item.nodeid)
        if (used & _SESSION_ENGINES and module not in _SESSION_ENGINE_MODULES) or (
            used & _BOOTING_FIXTURES and module not in _SESSION_ENGINE_MODULES | _MODULE_GROUPED
        ):
            ungrouped.append(item.nodeid)
    if unmarked:
        raise pytest.UsageError("tests that boot an engine must be marked slow: " + ", ".join(unmarked))
    if ungrouped:
        raise pytest.UsageError(
            "add the module to _SESSION_ENGINE_MODULES (session engines) or _MODULE_GROUPED (a module-scoped "
            "server or model) in tests/conftest.py: " + ", ".join(ungrouped)
        )
    items.sort(key=_rank)  # stable: each module keeps its own order (module-scoped fixtures)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
        """xdist's scope scheduler over the groups above, handed out in the collection's order
        (``_rank``), not xdist's largest-group-first."""

        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            if module in _SESSION_ENGINE_MODULES:
                return "session-engines"
            return module if module in _MODULE_GROUPED else nodeid

    config.option.loadscopereorder = False
    return Grouped(config, log)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _WORKER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    return ensure_tiny_models(CACHE_DIR)


@pytest.fixture(scope="session")
def subprocess_env(tiny_models: TinyModels) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k.upper() not in _WORKER_ENV}
    env["WORKER_CACHE_DIR"] = str(CACHE_DIR)
    # Pods fork their engine core too (their default is spawn, as vLLM's server does): on a CPU a
    # spawned engine core and model worker each import vLLM again, ~20 s a boot on two cores.
    # tests/test_pod.py's pod keeps the default.
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    yield env


@pytest.fixture(scope="session")
async def default_engine(tiny_models: TinyModels) -> AsyncIterator[Any]:
    """The embedded default (tiny target, the noisy-copy draft, k=3) with a tiny LoRA adapter
    loadable by name: one engine for every test that needs no configuration of its own."""
    engine = await boot_engine(tiny_models, **LORA_ENV)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
async def plain_engine(tiny_models: TinyModels) -> AsyncIterator[Any]:
    """The tiny target without speculation (it samples at any temperature on a CPU too)."""
    engine = await boot_engine(tiny_models, MODEL_NAME="tiny:target")
    yield engine
    engine.shutdown()
