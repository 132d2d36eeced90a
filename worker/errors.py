"""Typed errors of the worker, converted to wire payloads at each edge by one function.

WorkerError                  base: a message safe to show a client
├── InvalidRequest           bad input (HTTP 400)
│   ├── ContextLengthExceeded
│   └── RequestTooLarge      a body over MAX_REQUEST_BYTES (HTTP 413)
├── AuthError                missing or wrong API key (HTTP 401)
├── ConfigError              bad environment configuration (fails the boot)
├── EngineBootError          the engine could not start (the worker must be replaced)
│   ├── IncompatibleDraft    the draft model cannot draft for the target
│   ├── VllmInternalsMissing the installed vLLM lacks an internal the worker's seam relies on
│   └── UnsupportedVllm      the installed vLLM is outside the releases the seam spans
├── EngineDead               the engine died while serving (the worker must be replaced)
├── EngineBusy               back-pressure: retry later (HTTP 429)
└── EngineNotReady           still booting (HTTP 503)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "AuthError",
    "ConfigError",
    "ContextLengthExceeded",
    "EngineBootError",
    "EngineBusy",
    "EngineDead",
    "EngineNotReady",
    "IncompatibleDraft",
    "InvalidRequest",
    "RequestTooLarge",
    "UnsupportedVllm",
    "VllmInternalsMissing",
    "WorkerError",
    "describe_validation_errors",
    "one_line",
    "to_error_payload",
    "to_openai_error",
    "without_native_locations",
]


class WorkerError(Exception):
    """Base class. ``message`` is shown to clients; ``error_type``/``status`` follow OpenAI's shape."""

    error_type = "server_error"
    status = 500
    is_fatal = False  # the worker cannot serve any more: ask the platform to replace it

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(WorkerError):
    error_type = "invalid_request_error"
    status = 400


class ContextLengthExceeded(InvalidRequest):
    pass


class RequestTooLarge(InvalidRequest):
    status = 413


class AuthError(WorkerError):
    error_type = "authentication_error"
    status = 401


class ConfigError(WorkerError):
    error_type = "configuration_error"
    is_fatal = True


class EngineBootError(WorkerError):
    error_type = "engine_boot_error"
    status = 503
    is_fatal = True


class IncompatibleDraft(EngineBootError):
    pass


class VllmInternalsMissing(EngineBootError):
    """The installed vLLM lacks what ``worker/vllm_internals/`` relies on (its contract); the message
    names each internal and the module that needs it. Raised before the engine starts."""


class UnsupportedVllm(EngineBootError):
    """The installed vLLM is outside the window of releases the seam spans (or none is installed):
    raised when the seam loads (``worker.vllm_internals.release``), so that the boot fails with one
    sentence naming the version found, before any variant is picked."""


class EngineDead(WorkerError):
    error_type = "engine_dead"
    status = 503
    is_fatal = True


class EngineBusy(WorkerError):
    error_type = "rate_limit_error"
    status = 429


class EngineNotReady(WorkerError):
    error_type = "engine_not_ready"
    status = 503


def _safe(error: BaseException) -> WorkerError:
    # Unexpected exceptions get a generic message: a traceback or a repr never reaches a client.
    if isinstance(error, WorkerError):
        return error
    return WorkerError(f"internal error ({type(error).__name__})")


def to_error_payload(error: BaseException) -> dict[str, Any]:
    """The native ``{"error": "<message>", "error_type": ...}`` item for any exception."""
    safe = _safe(error)
    payload: dict[str, Any] = {"error": safe.message, "error_type": safe.error_type}
    if safe.param:
        payload["param"] = safe.param
    return payload


def to_openai_error(error: BaseException) -> dict[str, Any]:
    """OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, for any exception."""
    safe = _safe(error)
    return {"error": {"message": safe.message, "type": safe.error_type, "param": safe.param, "code": safe.status}}


def describe_validation_errors(
    errors: Iterable[Mapping[str, Any]],
    *,
    place: Callable[[Sequence[Any]], str] | None = None,
    limit: int | None = None,
    one_per_place: bool = False,
    suggest: Callable[[Sequence[Any]], str | None] | None = None,
) -> str:
    """pydantic's validation errors (``exc.errors()``) as one line, ``place: message`` each, never
    echoing the input: the settings' (places as variables), a request's (as fields), vLLM's config's
    (as the variable that set the value). ``place``: a location's name ("" for a rule across
    fields, which names its fields itself; default: the parts joined by dots); ``limit``: how many
    problems are named before "and N more"; ``one_per_place``: the first complaint per place only
    (a union's other branches add only noise); ``suggest``: for an unknown field's location, the
    field meant, or None."""
    problems: dict[str, None] = {}
    seen: set[str] = set()
    for error in errors:
        loc = tuple(error.get("loc", ()))
        where = place(loc) if place is not None else ".".join(str(part) for part in loc)
        if one_per_place and where in seen:
            continue
        seen.add(where)
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "extra_forbidden":
            meant = suggest(loc) if suggest is not None else None
            message = f"unknown field (did you mean {meant}?)" if meant else "unknown field"
        problems[f"{where}: {message}" if where else message] = None
    named = list(problems)
    if limit is not None and len(named) > limit:
        named = [*named[:limit], f"and {len(named) - limit} more"]
    return "; ".join(named)


# A native library's log prefix in its messages: xgrammar's "[18:26:21] /project/cpp/regex_converter.cc:83: ".
_NATIVE_LOCATION = re.compile(r"\[\d\d:\d\d:\d\d\] [\w./-]+:\d+: ")


def without_native_locations(message: str) -> str:
    """``message`` without the time and source location a native library (xgrammar) writes in front
    of its own: the reader's problem is the rest."""
    return _NATIVE_LOCATION.sub("", message)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (pydantic's validation errors name the field on the
    lines after the first), without pydantic's links or a native library's source locations."""
    text = without_native_locations(str(exc))
    lines = [line.strip() for line in text.strip().splitlines() if "errors.pydantic.dev" not in line]
    return " ".join(line for line in lines if line)[:500] or type(exc).__name__
