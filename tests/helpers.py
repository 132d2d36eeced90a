"""Process and port helpers shared by the tests that start servers."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

__all__ = ["alive_after", "descendants", "free_port", "is_alive"]


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
