"""What tests share besides fixtures: settings and engines over the tiny models, and the process
and port helpers of the tests that start servers."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker import runtime
from worker.config import Settings, load_settings
from worker.runtime import EngineHolder, EngineProtocol
from worker.serverless import ServerlessWorker
from worker.tiny_models import TinyModels

if TYPE_CHECKING:
    from worker.engine import Engine

__all__ = [
    "CACHE_DIR",
    "alive_after",
    "boot_engine",
    "descendants",
    "engine_settings",
    "free_port",
    "is_alive",
    "worker_for",
]

CACHE_DIR = Path(os.environ.get("WORKER_CACHE_DIR", str(Path.home() / ".cache" / "runpod-vllm-worker")))


def engine_settings(**env: Any) -> Settings:
    values = {"WORKER_CACHE_DIR": str(CACHE_DIR), "MAX_NUM_SEQS": "16"}
    values.update({key: str(value) for key, value in env.items()})
    return load_settings(values)


def worker_for(engine: EngineProtocol, **env: Any) -> ServerlessWorker:
    """A serverless worker serving ``engine``, already booted (a real engine or a FakeEngine)."""

    async def factory(_: Settings) -> EngineProtocol:
        return engine

    return ServerlessWorker(EngineHolder(settings_loader=lambda: engine_settings(**env), engine_factory=factory))


async def boot_engine(tiny_models: TinyModels, **env: Any) -> Engine:
    """A real CPU engine over the tiny models (``tiny_models``: the fixture that built them)."""
    return await runtime.boot_engine(engine_settings(**env), mode="serverless")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.split()
    pairs = list(zip(map(int, out[::2]), map(int, out[1::2]), strict=True))
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in pairs if pp == parent]
        found += children
        frontier += children
    return found


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, or a reaped process, is not alive)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def alive_after(pids: list[int], timeout_s: float) -> list[int]:
    """Those of ``pids`` still running once they all exited or ``timeout_s`` passed."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.3)
    return [pid for pid in pids if is_alive(pid)]
