"""vLLM's own OpenAI serving layer over the worker's engine: for the pod and RunPod's ``openai_route``.

vLLM builds the whole OpenAI surface (chat, completions, responses, models, tokenize, embeddings;
tool-call and reasoning parsers; LoRA adapters by model name; per-request ``metrics``) over any
engine client. :meth:`OpenAIServer.create` hands it the worker's ``AsyncLLM``, its ``generate`` passed through
the worker's observers (by the seam), with vLLM's server arguments made from the settings by
vLLM's own parser. :meth:`OpenAIServer.call` drives the app in-process for a RunPod job (no port),
streaming its events; the pod's gate is in ``worker/pod.py``. Imports vLLM: loaded only on use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from argparse import Namespace
from collections.abc import AsyncIterator, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import pydantic
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler as fastapi_http_exception_handler
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import TypeAdapter
from starlette.exceptions import HTTPException
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.app import build_app
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from worker.boot.heap import freeze_heap
from worker.config import Settings
from worker.engine import Engine
from worker.errors import EngineDead, describe_validation_errors, to_openai_error, without_native_locations
from worker.vllm_internals.check import require_internals
from worker.vllm_internals.openai_layer import (
    add_exception_handlers,
    answer_http_error,
    error_answer,
    field_path,
    generating_through,
)
from worker.vllm_internals.variants import server_arg_parser

__all__ = ["OpenAIResponse", "OpenAIServer", "describe_request_errors", "server_args", "server_flags"]


def server_args(settings: Settings, *, model_path: str, lora_paths: dict[str, str] | None = None) -> Namespace:
    """vLLM's server arguments (its own parser and defaults) for the worker's settings;
    ``lora_paths``: each configured adapter's resolved path, by name."""
    argv = ["--model", model_path, *server_flags(settings, lora_paths=lora_paths)]
    return cast(Namespace, server_arg_parser().parse_args(argv))


def server_flags(settings: Settings, *, lora_paths: dict[str, str] | None = None) -> list[str]:
    """The serving-layer flags of ``vllm serve`` that the worker's settings stand for (the
    benchmark gives vLLM's own server the same)."""
    argv = [
        "--served-model-name",
        settings.served_model_name,
        "--response-role",
        settings.response_role,
        "--disable-fastapi-docs",
        # usage.prompt_tokens_details.cached_tokens (the prefix cache's hits); the timings beside the
        # acceptance stats in an answer's metrics block (time to first token, queue, decode): null without
        *("--enable-prompt-tokens-details", "--enable-per-request-metrics"),
    ]
    if settings.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if settings.tool_call_parser:
        argv += ["--tool-call-parser", settings.tool_call_parser]
    if settings.reasoning_parser:
        argv += ["--reasoning-parser", settings.reasoning_parser]
    if settings.chat_template:
        argv += ["--chat-template", settings.chat_template]
    if lora_paths:
        argv += ["--lora-modules", *(json.dumps({"name": n, "path": p}) for n, p in lora_paths.items())]
    return argv


def _observed_generate(engine: Engine) -> Callable[..., AsyncIterator[Any]]:
    """The ``generate`` vLLM's layer calls: the engine's own, passed through :meth:`Engine.observe`
    (vLLM's layer calls the engine directly, and the worker's metrics must see those requests too),
    after the worker's refusals of what this engine cannot sample faithfully."""
    llm = engine.llm

    def generate(prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any) -> AsyncIterator[Any]:
        problem = engine.unsupported_sampling(sampling_params)
        if problem is not None:
            name, message = problem
            raise VLLMValidationError(message, parameter=name)  # vLLM's layer answers 400
        outputs: AsyncIterator[Any] = llm.generate(prompt, sampling_params, request_id, **kwargs)
        # Only structured outputs fail with a native library's message (xgrammar's).
        is_structured = sampling_params.structured_outputs is not None
        return engine.observe(_clean_validation_errors(outputs) if is_structured else outputs, request_id)

    return generate


async def _clean_validation_errors(outputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """vLLM's request validation errors without the source locations xgrammar writes into them."""
    try:
        async for output in outputs:
            yield output
    except VLLMValidationError as exc:
        message = str(exc.args[0]) if exc.args else type(exc).__name__  # str(exc) appends the parameter
        raise VLLMValidationError(without_native_locations(message), parameter=exc.parameter) from None


def _answer_engine_errors(app: FastAPI, engine: Engine) -> None:
    """The engine's own errors answered as the worker's: vLLM's handler for them stops vLLM's uvicorn
    server through ``app.state.server``, which only vLLM's launcher sets (a request in flight when the
    engine died got ``500 "'State' object has no attribute 'server'"``). A dead engine is the typed
    engine-dead error (503); the pod exits by its own watch (``worker/pod.py``); a failure
    ``generate`` wrapped comes worded by ``Engine.observe``. And FastAPI's 400 for
    a body it cannot read (Starlette's ``HTTPException``, which vLLM's handler, typed for FastAPI's
    subclass, misses) in OpenAI's ``{"error": ...}`` shape; its 404 and 405 keep theirs."""

    async def answer(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, EngineDeadError) or engine.is_dead:
            error = EngineDead("the inference engine died while serving this request")
            return JSONResponse(to_openai_error(error), status_code=error.status)
        body, status = error_answer(exc)  # a request-specific failure: vLLM's own answer
        return JSONResponse(body, status_code=status)

    async def unreadable(request: Request, exc: HTTPException) -> Response:
        # A 400 is FastAPI's "error parsing the body"; its 404 and 405 (no such route, method) stay
        # FastAPI's, which the serverless route turns into sentences naming the route.
        if exc.status_code == 400:
            return await answer_http_error(request, exc)  # vLLM's own handler
        return await fastapi_http_exception_handler(request, exc)

    add_exception_handlers(app, {EngineDeadError: answer, EngineGenerateError: answer, HTTPException: unreadable})


def describe_request_errors(errors: Any, *, prefix: str = "") -> str:
    """A request's validation errors as one sentence naming each field, e.g. ``openai_input.messages:
    field required``, where vLLM's layer answers with a rendering of pydantic's error dicts.
    Field paths are vLLM's own (``field_path``), without the leading ``body``."""

    def place(loc: Sequence[Any]) -> str:
        parts = [str(part) for part in loc if part != "body"]
        return f"{prefix}{field_path(parts)}" if parts else ""

    lowered = [{**error, "msg": _lower_first(str(error.get("msg", "invalid")))} for error in errors]
    return describe_validation_errors(lowered, place=place, limit=3) or "the request is not valid"


def _lower_first(message: str) -> str:
    message = message.removeprefix("Value error, ")
    return message[:1].lower() + message[1:]


@dataclass(slots=True)
class OpenAIResponse:
    """One in-process response: status, whether it streams, its body as it comes, and for a
    request vLLM's layer refused as invalid, the reason as a sentence (``problem``)."""

    status: int
    is_stream: bool
    body: AsyncIterator[bytes]
    problem: str | None = None

    async def json(self) -> Any:
        return json.loads(b"".join([part async for part in self.body]) or b"null")

    async def events(self) -> AsyncIterator[str]:
        """Server-sent events, one ``data: ...\\n\\n`` string each, ``data: [DONE]`` included."""
        buffer = ""
        async for part in self.body:
            buffer += part.decode()
            while "\n\n" in buffer:
                event, buffer = buffer.split("\n\n", 1)
                if event.strip():
                    yield event + "\n\n"
        if buffer.strip():
            yield buffer


class OpenAIServer:
    """vLLM's OpenAI app over one booted engine."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    @classmethod
    async def create(cls, engine: Engine, settings: Settings) -> OpenAIServer:
        require_internals()  # the OpenAI layer's too, now that vLLM's serving modules are loaded
        llm = engine.llm
        lora_paths = {name: request.lora_path for name, request in engine.lora_requests.items()}
        args = server_args(settings, model_path=llm.vllm_config.model_config.model, lora_paths=lora_paths)
        tasks = await llm.get_supported_tasks()
        app = build_app(args, tasks, llm.model_config)
        await init_app_state(generating_through(llm, _observed_generate(engine)), app.state, args, tasks)
        _answer_engine_errors(app, engine)
        # What vLLM's server does in its app's lifespan, which does not run here (the app is
        # mounted, or called in-process): move the serving layer just built (templates, parsers,
        # tokenizer caches) out of the garbage collector's sight, as the engine's boot did for the
        # engine, so that collections while serving do not walk it again and again.
        freeze_heap()
        return cls(app)

    def _describe_invalid(self, path: str, body: Any) -> str | None:
        """Why vLLM's layer refused ``body`` as invalid, as a sentence naming each field, or None when
        its request model accepts the body (the refusal was about something else). vLLM answers with
        a rendering of pydantic's error dicts and keeps the errors themselves in its handler, so the
        body is validated again against the route's own request model, on the error path only."""
        route = next(
            (r for r in self.app.routes if isinstance(r, APIRoute) and r.path == path and r.body_field is not None),
            None,
        )
        model = None if route is None or route.body_field is None else route.body_field.field_info.annotation
        if model is None or not isinstance(body, dict):
            return None
        try:
            TypeAdapter(model).validate_python(body)
        except pydantic.ValidationError as exc:
            return describe_request_errors(exc.errors(), prefix="openai_input.")
        except Exception:  # vLLM's own checks inside its validators: its message stands
            return None
        return None

    async def call(self, method: str, path: str, body: Any = None) -> OpenAIResponse:
        """One request through the app, in-process. The body streams as the app sends it;
        closing it (or cancelling the consumer) tells the app the client went away, which
        aborts the engine request as a dropped HTTP connection would."""
        raw = b"" if body is None else json.dumps(body).encode()
        messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        gone = asyncio.Event()
        is_body_read = False

        async def receive() -> dict[str, Any]:
            nonlocal is_body_read
            if not is_body_read:
                is_body_read = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            await messages.put(dict(message))

        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
            "client": ("127.0.0.1", 0),
            "server": ("127.0.0.1", 0),
        }

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                await messages.put({"type": "worker.done"})

        task = asyncio.create_task(run())
        start = await messages.get()
        if start["type"] != "http.response.start":  # the app ended without answering
            await task  # raises what it raised
            raise RuntimeError("the OpenAI app sent no response")
        headers = {key.decode().lower(): value.decode() for key, value in start.get("headers", [])}

        async def body_parts() -> AsyncIterator[bytes]:
            is_complete = False
            try:
                while not is_complete:
                    message = await messages.get()
                    if message["type"] == "worker.done":
                        break
                    if message.get("body"):
                        yield message["body"]
                    is_complete = not message.get("more_body", False)
            finally:
                gone.set()
                if not is_complete and not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        return OpenAIResponse(
            status=int(start["status"]),
            is_stream=headers.get("content-type", "").startswith("text/event-stream"),
            body=body_parts(),
            problem=self._describe_invalid(path, body) if int(start["status"]) in (400, 422) else None,
        )
