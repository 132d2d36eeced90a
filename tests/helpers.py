"""Process and port helpers shared by the tests that start servers."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

__all__ = ["descendants", "free_port", "is_alive"]


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
