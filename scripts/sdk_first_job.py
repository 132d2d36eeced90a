"""Times a serverless cold start through the RunPod SDK's local API, as a worker started for a
waiting job sees it: ``handler.py --rp_serve_api`` is launched, one job is posted to ``/runsync``
as soon as the port answers, and the handler's log stamps give when the SDK handed the job over
("booting engine") and when vLLM's import ended ("vLLM imported"), from process start.

    python scripts/sdk_first_job.py [--env KEY=VALUE ...] [--rounds N]

Prints one JSON line per round. Stdlib and httpx only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
JOB = {"input": {"prompt": "Once upon a time", "stream": False, "sampling_params": {"max_tokens": 4}}}
STAMPS = {
    "job_handed_over_s": "booting engine for model",
    "vllm_imported_s": "vLLM imported in",
    "ready_s": "engine ready in",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_round(env: dict[str, str]) -> dict[str, float | None]:
    port = free_port()
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, "handler.py", "--rp_serve_api", "--rp_api_port", str(port)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while True:
                try:
                    response = httpx.post(f"http://127.0.0.1:{port}/runsync", json=JOB, timeout=600)
                    break
                except httpx.TransportError:
                    if proc.poll() is not None:
                        tail = Path(log.name).read_text()[-2000:]
                        raise SystemExit(f"handler exited {proc.returncode}: {tail}") from None
                    time.sleep(0.05)
            answered = time.time() - started
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        text = Path(log.name).read_text()
    result: dict[str, float | None] = {"answered_s": round(answered, 2), "status": response.status_code}
    for key, needle in STAMPS.items():
        match = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*" + re.escape(needle), text, re.M)
        if match is None:
            result[key] = None
            continue
        stamp = time.mktime(time.strptime(match.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + int(match.group(1)[20:]) / 1000
        result[key] = round(stamp - started, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the handler")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    for _ in range(args.rounds):
        print(json.dumps(one_round(env)), flush=True)


if __name__ == "__main__":
    main()
