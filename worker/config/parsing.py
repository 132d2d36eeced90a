"""How the environment's strings become the values of Settings' fields (what pydantic does not do
itself): JSON objects, comma-separated host names, LoRA modules (:class:`LoraModule`). Pure; a
ValueError names what is wrong, and Settings' error names the variable."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "LoraModule",
    "domain_list",
    "format_tokens_by_batch",
    "json_object",
    "lora_modules",
    "parse_tokens_by_batch",
    "schedule",
]


class LoraModule(BaseModel):
    """One LoRA adapter: the name requests use, and a local path or hub id (``tiny:`` names too)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)


def json_object(value: Any) -> Any:
    """A JSON object (a string is parsed; a blank one is unset)."""
    if isinstance(value, str):
        if not value.strip():
            return None
        value = _json(value)
    if value is not None and not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value


def domain_list(value: Any) -> Any:
    """Host names separated by commas, lower-cased (none: unset)."""
    if isinstance(value, str):
        return [name.strip().lower() for name in value.split(",") if name.strip()] or None
    return value


def lora_modules(value: Any) -> Any:
    """vLLM's JSON form (a list of {"name", "path"} objects), or ``name=path`` pairs separated by spaces."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return []
    if text.startswith("["):
        return _json(text)
    modules = []
    for pair in text.split():
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ValueError(f'{pair!r} is not name=path (or give a JSON list of {{"name", "path"}})')
        modules.append({"name": name, "path": path})
    return modules


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos})") from None


def parse_tokens_by_batch(text: str) -> list[tuple[int, int, int]] | None:
    """``SPECULATIVE_TOKENS_BY_BATCH``: ``start-end:k`` ranges, comma-separated (``1-8:4,9-64:2,65-256:0``),
    to vLLM's ``num_speculative_tokens_per_batch_size``. vLLM checks the same rules at boot (its
    ``validate_and_normalize_dynamic_sd_schedule``); checked here, without importing vLLM, so that the
    error is one sentence naming the variable. Blank: None."""
    if not text.strip():
        return None
    entries: list[tuple[int, int, int]] = []
    for part in text.split(","):
        span, sep, k_text = part.strip().partition(":")
        start_text, dash, end_text = span.partition("-")
        try:
            start = int(start_text)
            end = int(end_text) if dash else start
            k = int(k_text)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not start-end:k (e.g. 1-8:4,9-256:0)") from None
        if not sep or start < 1 or end < start or k < 0:
            raise ValueError(f"{part.strip()!r} is not start-end:k with 1 <= start <= end and k >= 0")
        if entries and start <= entries[-1][1]:
            raise ValueError("batch-size ranges must be in increasing order without overlap")
        entries.append((start, end, k))
    if entries[0][0] != 1:
        raise ValueError("the first batch-size range must start at 1")
    return entries


def format_tokens_by_batch(entries: Any) -> Any:
    """A schedule of ``(start, end, k)`` entries in ``SPECULATIVE_TOKENS_BY_BATCH``'s form, the one
    users type (``1-8:4,9-64:2``): the inverse of :func:`parse_tokens_by_batch`. Anything else as it is."""
    if isinstance(entries, list | tuple) and all(isinstance(e, list | tuple) and len(e) == 3 for e in entries):
        return ",".join(f"{start}-{end}:{k}" for start, end, k in entries) if entries else None
    return entries


def schedule(value: Any) -> Any:
    """``SPECULATIVE_TOKENS_BY_BATCH`` as given: a string is parsed (:func:`parse_tokens_by_batch`)."""
    return parse_tokens_by_batch(value) if isinstance(value, str) else value
