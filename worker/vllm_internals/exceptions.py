"""The worker's exceptions that are vLLM's exceptions too, so that vLLM's layer answers them as its own."""

from __future__ import annotations

from vllm.exceptions import VLLMValidationError

__all__ = ["MediaURLRefused"]


class MediaURLRefused(VLLMValidationError):
    """A media URL the worker will not fetch (``worker.media``); the message says why. A vLLM
    validation error: vLLM's layer passes it through as a 400 with its message (a ``ValueError``
    raised during a fetch it would turn into "Invalid URL")."""
