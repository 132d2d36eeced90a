"""What the soak's scenarios share (``pod_traffic``, ``serverless_traffic``). A scenario is a
request (or a burst) that ends ``ok``, as an intended refusal or disconnect, or raises
:class:`Lost` (a 5xx, an error event, an answer of the wrong shape)."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = [
    "ADAPTER",
    "DISCONNECTED",
    "JSON_HEADERS",
    "MODEL",
    "OK",
    "PNG",
    "REFUSED",
    "TOOLS",
    "Lost",
    "Scenario",
    "chat_body",
    "check",
    "read_sse",
    "refusal",
]

MODEL = "tiny:target"
ADAPTER = "tiny-lora"
# A 1x1 PNG: a valid image part, which the text-only tiny models refuse with a 400.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
    )
).decode()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    }
]
OK, REFUSED, DISCONNECTED = "ok", "refused", "disconnected"


class Lost(Exception):
    """An answer that is neither a result nor an intended error."""


Scenario = Callable[[Any, random.Random], Awaitable[Any]]


def chat_body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Lost(what)


def refusal(response: Any, *, refused: tuple[int, ...] = ()) -> str | None:
    """None for a 200; REFUSED for an intended refusal in OpenAI's error shape; else Lost."""
    if response.status_code == 200:
        return None
    if response.status_code in refused:
        body = response.json()
        check(isinstance(body.get("error", {}).get("message"), str), f"{response.status_code} without a message")
        return REFUSED
    raise Lost(f"HTTP {response.status_code}: {response.text[:200]}")


async def read_sse(client: Any, url: str, body: dict[str, Any], *, read_events: int | None = None) -> list[Any] | str:
    """The events of a streamed answer, REFUSED on a 429, or DISCONNECTED after ``read_events``."""
    async with client.stream("POST", url, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return refusal(response, refused=(429,)) or REFUSED
        events: list[Any] = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return events
            event = json.loads(line[6:])
            check("error" not in event, f"error event: {line[:200]}")
            events.append(event)
            if read_events is not None and len(events) >= read_events:
                return DISCONNECTED  # leaving the block closes the connection mid-stream
    raise Lost("stream ended without [DONE]")


JSON_HEADERS = {"content-type": "application/json"}
