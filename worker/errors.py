"""Typed errors of the worker, converted to wire payloads at each edge by one function.

WorkerError                  base: a message safe to show a client
├── InvalidRequest           bad input (HTTP 400)
│   └── ContextLengthExceeded
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
    "ConfigError",
    "ContextLengthExceeded",
    "EngineBootError",
    "EngineBusy",
    "EngineDead",
    "EngineNotReady",
    "IncompatibleDraft",
    "InvalidRequest",
    "WorkerError",
    "to_error_payload",
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


def to_error_payload(error: BaseException) -> dict[str, Any]:
    """The ``{"error": ..., "error_type": ...}`` payload for any exception.

    Unexpected exceptions get a generic message: a traceback or a repr never reaches a client.
    """
    if isinstance(error, WorkerError):
        payload: dict[str, Any] = {"error": error.message, "error_type": error.error_type}
        if error.param:
            payload["param"] = error.param
        return payload
    return {"error": f"internal error ({type(error).__name__})", "error_type": "server_error"}
