"""Pod mode: a long-running OpenAI-compatible HTTP server over the same engine module.

Routes::

    POST /v1/chat/completions   POST /v1/completions   (SSE when "stream": true)
    GET  /v1/models             GET  /health  GET /ping  (503 while booting or dead, 200 ready)
    GET  /metrics               Prometheus: vLLM's engine metrics and the worker's own

With an API key configured, ``/v1/*`` need ``Authorization: Bearer <key>`` (compared in
constant time). Errors use OpenAI's shape and status codes; a client that disconnects
mid-stream aborts its engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import ClientDisconnect

from worker.errors import EngineBusy, InvalidRequest, WorkerError
from worker.metrics import render_metrics
from worker.openai_compat import OpenAICall, error_body, models_response, parse_openai_call, sse
from worker.runtime import EngineHolder

__all__ = ["create_app"]

log = logging.getLogger(__name__)


class AuthError(WorkerError):
    error_type = "authentication_error"
    status = 401


class ModelNotFound(WorkerError):
    error_type = "model_not_found"
    status = 404


class RequestTooLarge(InvalidRequest):
    status = 413


FATAL_EXIT_DELAY_S = 2.0  # long enough for a health check to see the 503


def _error_response(error: Exception) -> JSONResponse:
    status = error.status if isinstance(error, WorkerError) else 500
    headers = {"Retry-After": "5"} if status in (429, 503) else None
    return JSONResponse(error_body(error), status_code=status, headers=headers)


def create_app(holder: EngineHolder, *, boot_on_startup: bool = True) -> FastAPI:
    settings = holder.settings
    started = int(time.time())

    in_flight = 0

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

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.fatal = False
        tasks: list[asyncio.Task[Any]] = []
        if boot_on_startup:
            boot = asyncio.create_task(holder.get())
            boot.add_done_callback(lambda task: task.cancelled() or task.exception())  # errors show in /health
            tasks += [boot, asyncio.create_task(watch_engine(app))]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            holder.shutdown()

    app = FastAPI(title="runpod-vllm-worker", lifespan=lifespan, docs_url=None, redoc_url=None)

    @app.exception_handler(WorkerError)
    async def _worker_error(request: Request, exc: WorkerError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return _error_response(exc)

    def authorize(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), settings.api_key.encode()):
            raise AuthError("missing or invalid API key (send 'Authorization: Bearer <key>')")

    def health_response() -> JSONResponse:
        state = holder.state
        body: dict[str, Any] = {"status": state}
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

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorize(request)
        return JSONResponse(models_response(settings.served_model_name, created=started))

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_request_bytes:
            raise RequestTooLarge(f"request body exceeds {settings.max_request_bytes} bytes (MAX_REQUEST_BYTES)")
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > settings.max_request_bytes:
                raise RequestTooLarge(f"request body exceeds {settings.max_request_bytes} bytes (MAX_REQUEST_BYTES)")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise InvalidRequest("request body is not valid JSON") from None

    async def completion(request: Request, route: str) -> Response:
        nonlocal in_flight
        authorize(request)
        try:
            body = await read_json(request)
        except ClientDisconnect:
            return Response(status_code=499)
        openai_request, generate_request = parse_openai_call(route, body)
        if openai_request.model != settings.served_model_name:
            raise ModelNotFound(
                f"model {openai_request.model!r} is not served here; this server serves {settings.served_model_name!r}",
                param="model",
            )
        engine = holder.ready_engine()
        capacity = engine.max_num_seqs + (
            engine.max_num_seqs if settings.max_queue_depth is None else settings.max_queue_depth
        )
        if in_flight >= capacity:
            raise EngineBusy(f"server at capacity ({in_flight} requests in flight); retry shortly")
        in_flight += 1
        is_streaming = False
        try:
            call = OpenAICall(openai_request, model=settings.served_model_name)
            chunks = engine.generate(generate_request, request_id=call.id)
            if not openai_request.stream:
                return JSONResponse(await call.collect(chunks))
            # Validate before the 200 goes out: errors in the request itself must be a 4xx, not a broken stream.
            stream = call.stream(chunks)
            first = await anext(stream)
            is_streaming = True
        finally:
            if not is_streaming:
                in_flight -= 1

        async def events() -> AsyncIterator[str]:
            nonlocal in_flight
            try:
                yield first
                async for line in stream:
                    yield line
            except WorkerError as exc:
                yield sse(error_body(exc))
                yield "data: [DONE]\n\n"
            finally:
                in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await completion(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion(request, "/v1/completions")

    return app
