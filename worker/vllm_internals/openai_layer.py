"""The helpers of vLLM's OpenAI layer that the worker calls beyond its entrypoints: vLLM's own error
answer for an exception, its handler for FastAPI's HTTP errors, and its field paths for a request's
validation errors (``worker.openai`` says where each is used and why); the worker's exception
handlers added to the app vLLM built; and the engine client the worker hands the layer, vLLM's
``AsyncLLM`` with the worker's ``generate``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from vllm.engine.protocol import EngineClient
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.exception_handling.handlers.http import http_exception_handler
from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param
from vllm.v1.engine.async_llm import AsyncLLM

__all__ = ["add_exception_handlers", "answer_http_error", "error_answer", "field_path", "generating_through"]


def error_answer(exc: Exception) -> tuple[dict[str, Any], int]:
    """vLLM's own answer to a request-specific failure: its OpenAI error body and status."""
    response = create_error_response(exc)
    return response.model_dump(), int(response.error.code)


async def answer_http_error(request: Request, exc: HTTPException) -> Response:
    """vLLM's handler for FastAPI's ``HTTPException``, for Starlette's base class (it reads
    ``status_code`` and ``detail`` only)."""
    return cast("Response", await http_exception_handler(request, cast("Any", exc)))


def field_path(parts: Sequence[str]) -> str:
    """A validation error's location as vLLM's layer names the field (without the leading ``body``)."""
    return str(clean_loc_for_param(tuple(parts)))


def add_exception_handlers(app: FastAPI, handlers: Mapping[type[Exception], Callable[..., Any]]) -> None:
    """Add ``handlers`` (exception class -> handler) to the app vLLM's ``build_app`` made, over vLLM's
    own for the same classes. Starlette reads its handlers when it builds the app's middleware stack,
    which vLLM's set-up has already built (it is not None by then): it is built again with these."""
    for exc_class, handler in handlers.items():
        app.add_exception_handler(exc_class, handler)
    app.middleware_stack = app.build_middleware_stack()


class _GeneratingThrough:
    """``AsyncLLM`` with another ``generate``; every other attribute read is the engine's own."""

    def __init__(self, llm: AsyncLLM, generate: Callable[..., AsyncIterator[Any]]) -> None:
        self._llm = llm
        self.generate = generate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


def generating_through(llm: AsyncLLM, generate: Callable[..., AsyncIterator[Any]]) -> EngineClient:
    """The engine client for vLLM's OpenAI layer: ``llm`` with its ``generate`` replaced by
    ``generate`` (which calls ``llm.generate`` itself). vLLM's layer calls the engine directly and
    reads many of its attributes, which differ between releases; delegating them is what keeps that
    set vLLM's business, not a list of the worker's."""
    return cast("EngineClient", _GeneratingThrough(llm, generate))
