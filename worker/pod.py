"""Pod mode: a long-running OpenAI-compatible HTTP server over the same engine module.

The OpenAI surface is vLLM's own serving layer (``worker/openai.py``): ``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/v1/models`` and the rest of what vLLM serves for the
model's task, with its tool-call and reasoning parsers and LoRA adapters. The worker adds::

    GET /health  GET /ping     503 while booting, after a failed boot or with a dead engine; 200 ready
    GET /metrics               Prometheus: vLLM's engine metrics and the worker's own, one page
    GET /plan                  what serves: the boot plan's resolved choices, as a job's ``served`` block

Probes and scrapers carry no key, so ``/health``, ``/ping`` and ``/metrics`` answer without one;
``/plan`` names the model as ``/v1/models`` does, and asks for the key as it does. In front of
every other route, a gate vLLM's layer does not have: the API key
(``Authorization: Bearer <key>``, compared in constant time), the body limit (413), and
back-pressure (429 with ``Retry-After`` beyond ``max_num_seqs`` plus ``MAX_QUEUE_DEPTH``
requests in flight). A dead engine or a failed boot makes the process exit with status 1; a
client that disconnects aborts its engine request (vLLM's layer does that).

With ``API_SERVER_COUNT`` > 1 this app runs in each of N API processes over one engine core
(``worker/api_servers.py``), the in-flight count summed over all of them (``peers``). Every
process accepts connections from the start (so ``/health`` answers 503 while booting), and each
boots its own engine client: ``/health`` answers 200 only once every process of the pod is
ready (``ready_peers``), or a client routed by it would reach one still booting and get 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from worker.errors import (
    AuthError,
    ConfigError,
    EngineBusy,
    RequestTooLarge,
    WorkerError,
    to_openai_error,
)
from worker.metrics import is_multiprocess, render_metrics
from worker.runtime import EngineHolder

__all__ = ["FATAL_EXIT_DELAY_S", "InFlight", "ReadyPeers", "create_app", "listen_socket"]

log = logging.getLogger(__name__)

FATAL_EXIT_DELAY_S = 2.0  # long enough for a health check to see the 503
METRICS_REFRESH_S = 1.0  # several API processes: how often each writes its requests-in-engine gauge

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def listen_socket(host: str, port: int) -> socket.socket:
    """The pod's listening socket, bound before anything boots: uvicorn binds only after the app's
    startup, and a pod whose port was taken booted its whole engine before it said so. Raises
    :class:`ConfigError` naming the address."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (HOST)") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart over TIME_WAIT
        sock.bind(address)
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as exc:
        sock.close()
        hint = "another server holds it; set PORT or --port" if exc.errno == errno.EADDRINUSE else "HOST, PORT"
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} ({hint})") from None
    return sock


def _error_response(error: WorkerError) -> JSONResponse:
    headers = {"Retry-After": "5"} if error.status in (429, 503) else None
    return JSONResponse(to_openai_error(error), status_code=error.status, headers=headers)


ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Routes of the worker's own small app; every other path goes through the gate to vLLM's app.
_OWN_PATHS = frozenset({"/health", "/ping", "/metrics", "/plan"})
_KEYLESS_PATHS = frozenset({"/health", "/ping", "/metrics"})  # what probes and scrapers reach


class _Gate:
    """The pod's ASGI app: the worker's own routes and lifespan to its small app; every other
    request, after the API key, body limit and back-pressure checks, straight to vLLM's app.

    Hand-written rather than a Starlette mount because a mount puts the outer app's middleware
    (an error handler and an exception handler, each wrapping ``send``) in front of every
    streamed chunk: 2 of the 7 wrappers a chunk passed through, a share of the API process's CPU
    (py-spy; docs/benchmarks.md), and that process is what limits a pod at 256 streams."""

    def __init__(self, holder: EngineHolder, own: ASGIApp, *, peers: InFlight | None = None) -> None:
        self._holder = holder
        self._settings = holder.settings
        self._own = own
        self._peers = peers
        self.num_in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or (scope["type"] == "http" and scope["path"] in _OWN_PATHS):
            if scope["type"] == "http" and scope["path"] not in _KEYLESS_PATHS:
                try:
                    self._authorize(scope)
                except AuthError as exc:
                    await _error_response(exc)(scope, receive, send)
                    return
            await self._own(scope, receive, send)
            return
        if scope["type"] != "http":  # vLLM's websocket routes are not served through the gate
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        try:
            self._authorize(scope)
            body = await self._read_body(scope, receive)
            if body is None:  # the client went away while sending
                return
            engine = self._holder.ready_engine()
            server = await self._holder.openai()
            queue = engine.max_num_seqs if self._settings.max_queue_depth is None else self._settings.max_queue_depth
            num_in_flight = self.num_in_flight if self._peers is None else self._peers.get_num_requests()
            if num_in_flight >= engine.max_num_seqs + queue:
                raise EngineBusy(f"server at capacity ({num_in_flight} requests in flight); retry shortly")
        except WorkerError as exc:
            await _error_response(exc)(scope, receive, send)
            return
        self.num_in_flight += 1
        if self._peers is not None:
            self._peers.set_num_requests(self.num_in_flight)
        try:
            await server.app(scope, _replay(body, receive), send)
        finally:
            self.num_in_flight -= 1
            if self._peers is not None:
                self._peers.set_num_requests(self.num_in_flight)

    def _authorize(self, scope: Scope) -> None:
        key = self._settings.api_key
        if key is None:
            return
        header = next((v for k, v in scope.get("headers", []) if k.lower() == b"authorization"), b"")
        scheme, _, token = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), key.encode()):
            raise AuthError("missing or invalid API key (send 'Authorization: Bearer <key>')")

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        limit = self._settings.max_request_bytes
        too_large = RequestTooLarge(f"request body exceeds {limit} bytes (MAX_REQUEST_BYTES)")
        declared = next((v for k, v in scope.get("headers", []) if k.lower() == b"content-length"), b"")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise too_large
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the client's own messages (its disconnect)."""
    is_sent = False

    async def replay() -> Message:
        nonlocal is_sent
        if not is_sent:
            is_sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class InFlight(Protocol):
    """Requests in flight over every API process of a pod (vLLM's ``SharedAdmissionStats``: each
    process writes its own count to its slot of shared memory, a reader sums the slots; lock-free,
    so processes admitting at the same instant can overshoot the limit by at most one each)."""

    def set_num_requests(self, count: int) -> None: ...

    def get_num_requests(self) -> int: ...


class ReadyPeers(Protocol):
    """Which API processes of a pod have booted (a slot each in shared memory)."""

    def mark_ready(self) -> None: ...

    def num_ready(self) -> int: ...

    @property
    def count(self) -> int: ...


def create_app(
    holder: EngineHolder,
    *,
    boot_on_startup: bool = True,
    peers: InFlight | None = None,
    ready_peers: ReadyPeers | None = None,
) -> ASGIApp:
    """The pod's app over ``holder``; ``peers``: the in-flight count shared with the other API
    processes of the pod (``worker/api_servers.py``), for back-pressure over all of them;
    ``ready_peers``: which of them have booted, for ``/health``."""

    async def boot_engine() -> None:
        await holder.openai()
        if ready_peers is not None:
            ready_peers.mark_ready()

    async def watch_engine(app: FastAPI) -> None:
        """A dead engine or a failed boot cannot recover in-process: exit non-zero so a supervisor
        restarts the pod (after a moment in which /health answers 503)."""
        while holder.state not in ("dead", "failed"):
            await asyncio.sleep(0.5)
        app.state.fatal = True
        log.error("engine %s: exiting with status 1 so that the pod is restarted", holder.state)
        await asyncio.sleep(FATAL_EXIT_DELAY_S)
        holder.shutdown()  # reap what is left of the engine's processes
        logging.shutdown()
        os._exit(1)

    async def refresh_metrics() -> None:
        """With several API processes a scrape reads the others' files: keep this one's current."""
        while True:
            await asyncio.sleep(METRICS_REFRESH_S)
            if holder.metrics is not None:
                holder.metrics.refresh()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.fatal = False
        tasks: list[asyncio.Task[Any]] = []
        if boot_on_startup:
            boot = asyncio.create_task(boot_engine())
            boot.add_done_callback(lambda task: task.cancelled() or task.exception())  # errors show in /health
            tasks += [boot, asyncio.create_task(watch_engine(app))]
        if is_multiprocess():
            tasks.append(asyncio.create_task(refresh_metrics()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            holder.shutdown()

    app = FastAPI(title="runpod-vllm-worker", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def health_response() -> JSONResponse:
        state = holder.state
        body: dict[str, Any] = {"status": state}
        if ready_peers is not None:
            num_ready = ready_peers.num_ready()
            body["api_processes_ready"] = f"{num_ready}/{ready_peers.count}"
            if state == "ready" and num_ready < ready_peers.count:
                state = body["status"] = "booting"  # this process is ready, another is not yet
        if holder.boot_error is not None:
            body["error"] = holder.boot_error.message
        return JSONResponse(body, status_code=200 if state == "ready" else 503)

    @app.get("/health")
    async def health() -> JSONResponse:
        return health_response()

    @app.get("/ping")
    async def ping() -> JSONResponse:
        return health_response()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(holder.metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/plan")
    async def plan() -> JSONResponse:
        try:
            return JSONResponse(holder.ready_engine().served.model_dump(mode="json"))
        except WorkerError as exc:
            return _error_response(exc)

    return _Gate(holder, app, peers=peers)
