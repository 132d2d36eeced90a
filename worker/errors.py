"""Typed errors of the worker, converted to wire payloads at each edge by one function.

WorkerError                  base: a message safe to show a client
├── InvalidRequest           bad input (HTTP 400)
│   ├── ContextLengthExceeded
│   └── RequestTooLarge      a body over MAX_REQUEST_BYTES (HTTP 413)
├── AuthError                missing or wrong API key (HTTP 401)
├── ConfigError              bad environment configuration (fails the boot)
├── EngineBootError          the engine could not start (the worker must be replaced)
│   └── IncompatibleDraft    the draft model cannot draft for the target
├── EngineDead               the engine died while serving (the worker must be replaced)
├── EngineBusy               back-pressure: retry later (HTTP 429)
└── EngineNotReady           still booting (HTTP 503)
"""

from __future__ import annotations

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
    "WorkerError",
    "to_error_payload",
    "to_openai_error",
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
