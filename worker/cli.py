"""``python -m worker``: the pod-mode server and the tools around it.

    python -m worker serve [--host H] [--port P]   # OpenAI-compatible server (HOST, PORT, API_KEY, API_SERVER_COUNT)
    python -m worker bench [--smoke] [--parts ...]  # the benchmark against vLLM itself (worker/tools/bench/)
    python -m worker fit --model llama-3-8b --gpu H100 SXM ...   # memory and speed planner
    python -m worker plan --requests-per-hour 120 --tokens-per-s 2000 ...   # serverless vs pod cost
    python -m worker soak --minutes 60 --out DIR   # mixed traffic, watching for growth (worker/tools/soak.py)
    python -m worker vllm-contract --wheel vllm==0.33.0   # the seam's contract against another vLLM, unimported

Configuration is the same environment as the serverless handler's (``worker/config/``).
"""

from __future__ import annotations

import argparse
import logging
import sys

from worker import version_line
from worker.config import load_settings, num_api_servers
from worker.errors import ConfigError

__all__ = ["main"]

log = logging.getLogger("worker")

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_TOOLS = {
    "bench": "benchmark the worker against vLLM itself (python -m worker bench --help)",
    "fit": "will a model fit a GPU, and how fast will it decode",
    "plan": "serverless or pod: the cheaper deployment for a traffic profile",
    "quantize": "AWQ 4-bit quantization in its own environment",
    "download": "download a model (and draft) for baking into an image",
    "soak": "an hour of mixed traffic against the pod and the handler, watching memory, fds and threads",
    "vllm-contract": "check the seam's contract against another vLLM's sources, without importing it",
}


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from worker.boot.preflight import check_at_start
    from worker.pod import create_app
    from worker.runtime import EngineHolder

    flags = {"HOST": args.host, "PORT": args.port}
    try:
        settings = load_settings(overrides={name: value for name, value in flags.items() if value is not None})
        check_at_start(settings)  # before it listens: worker/boot/preflight.py
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if settings.host not in _LOOPBACK and settings.api_key is None:
        log.warning("=" * 72)
        log.warning("LISTENING ON %s WITHOUT AN API KEY: anyone who can reach this port can use the GPU", settings.host)
        log.warning("set API_KEY to require 'Authorization: Bearer <key>'")
        log.warning("=" * 72)
    from worker.pod import listen_socket

    try:
        sock = listen_socket(settings.host, settings.port)  # before anything boots
    except ConfigError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    if num_api_servers(settings) > 1:
        from worker.api_servers import serve

        return serve(settings, sock=sock)
    holder = EngineHolder(settings_loader=lambda: settings, mode="pod")
    app = create_app(holder)
    config = uvicorn.Config(
        app,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0 if server.started else 3  # uvicorn.run's status for a server that never started


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from worker.tools.bench.cli import main as bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["fit"]:
        from worker.tools.fit import main_fit

        return main_fit(argv[1:])
    if argv[:1] == ["download"]:
        from worker.tools.download import main as download_main

        return download_main(argv[1:])
    if argv[:1] == ["quantize"]:
        from worker.tools.quantize import main as quantize_main

        return quantize_main(argv[1:])
    if argv[:1] == ["soak"]:
        from worker.tools.soak import main as soak_main

        return soak_main(argv[1:])
    if argv[:1] == ["vllm-contract"]:
        from worker.tools.vllm_contract import main as contract_main

        return contract_main(argv[1:])
    if argv[:1] == ["plan"]:
        from worker.tools.costs import main_plan

        return main_plan(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    # The tools parse their own arguments (dispatched above); listed here so that --help shows them.
    for name, summary in _TOOLS.items():
        sub.add_parser(name, help=summary, add_help=False)
    serve = sub.add_parser(
        "serve",
        help="run the OpenAI-compatible pod server",
        description="Run the OpenAI-compatible pod server. Configured by the environment like the "
        "handler (README); API_KEY requires 'Authorization: Bearer <key>' on the OpenAI routes (/health, "
        "/ping and /metrics stay open; unset: no key, and a warning at start if --host is not a loopback address).",
    )
    serve.add_argument("--host", help="bind address (env HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (env PORT, default 8000)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return _serve(args)
    return 2  # pragma: no cover - argparse rejects unknown commands
