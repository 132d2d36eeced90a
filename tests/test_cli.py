"""``python -m worker serve`` before anything boots: the address it cannot listen on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from worker.config import Settings

ROOT = Path(__file__).resolve().parent.parent
_WORKER_ENV = {name.upper() for name in Settings.model_fields}


@pytest.mark.parametrize("num_api_servers", ["1", "2"])
def test_a_taken_port_ends_the_pod_at_once_naming_the_address(num_api_servers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k.upper() not in _WORKER_ENV}
        env["API_SERVER_COUNT"] = num_api_servers
        # The wait is bounded by the process's exit: the event is that it ends, naming the address,
        # before any engine boots (the log says when one does).
        out = subprocess.run(
            [sys.executable, "-m", "worker", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another server holds it; set PORT or --port)"
    )
    assert "booting engine" not in out.stderr and "Traceback" not in out.stderr
