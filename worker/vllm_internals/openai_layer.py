"""The helpers of vLLM's OpenAI layer that the worker calls beyond its entrypoints: vLLM's own error
answer for an exception, its handler for FastAPI's HTTP errors, and its field paths for a request's
validation errors (``worker.openai`` says where each is used and why)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from fastapi import Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.entrypoints.serve.exception_handling.handlers.http import http_exception_handler
from vllm.entrypoints.serve.exception_handling.handlers.validation import clean_loc_for_param

__all__ = ["answer_http_error", "error_answer", "field_path"]


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
