"""The pod's scenarios (OpenAI routes over HTTP)."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from worker.tools.soak.traffic import (
    ADAPTER,
    DISCONNECTED,
    JSON_HEADERS,
    MODEL,
    OK,
    PNG,
    REFUSED,
    TOOLS,
    Scenario,
    chat_body,
    check,
    read_sse,
    refusal,
)

__all__ = ["PodTraffic"]


class PodTraffic:
    def __init__(self, base: str) -> None:
        self.base = base

    async def chat_stream(self, client: Any, rng: random.Random) -> str:
        body = chat_body("Tell me a story.", max_tokens=rng.randint(8, 48), stream_options={"include_usage": True})
        events = await read_sse(client, self.base + "/v1/chat/completions", body)
        if isinstance(events, str):
            return events
        usage = events[-1].get("usage") or {}
        check(usage.get("completion_tokens", 0) >= 1, "no usage chunk")
        check(events[-1]["metrics"]["speculative_decoding"]["num_spec_steps"] >= 1, "no acceptance stats")
        return OK

    async def completion(self, client: Any, rng: random.Random) -> str:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": rng.randint(4, 48), "temperature": 0}
        response = await client.post(self.base + "/v1/completions", json=body)
        refused = refusal(response, refused=(429,))
        if refused:
            return refused
        answer = response.json()
        check(answer["usage"]["completion_tokens"] >= 1 and isinstance(answer["choices"][0]["text"], str), "no text")
        return OK

    async def disconnect(self, client: Any, rng: random.Random) -> str:
        body = chat_body("Count to one hundred.", max_tokens=200, ignore_eos=True)
        outcome = await read_sse(client, self.base + "/v1/chat/completions", body, read_events=rng.randint(1, 4))
        check(outcome in (DISCONNECTED, REFUSED), "the stream ended before the client left")
        return str(outcome)

    async def bad_input(self, client: Any, rng: random.Random) -> str:
        url = self.base + "/v1/chat/completions"
        case = rng.randrange(4)
        if case == 0:
            response = await client.post(url, content=b'{"model": "tiny:target", "messages": [', headers=JSON_HEADERS)
        elif case == 1:
            response = await client.post(url, json=chat_body("x", max_tokens="many"))
        elif case == 2:
            response = await client.post(url, json={**chat_body("x"), "model": "gpt-4"})
        else:
            response = await client.post(self.base + "/v1/completions", content=b"\xff\xfe{", headers=JSON_HEADERS)
        check(response.status_code in (400, 404, 429), f"bad input answered {response.status_code}")
        return refusal(response, refused=(400, 404, 429)) or OK

    async def stop_string(self, client: Any, rng: random.Random) -> str:
        body = {"model": MODEL, "prompt": "He counted one, two,", "max_tokens": 60, "temperature": 0, "stop": ["seven"]}
        response = await client.post(self.base + "/v1/completions", json=body)
        refused = refusal(response, refused=(429,))
        if refused:
            return refused
        answer = response.json()
        check(answer["choices"][0]["stop_reason"] == "seven", f"no stop: {answer['choices'][0]}")
        check(answer["metrics"]["speculative_decoding"]["num_spec_steps"] >= 1, "a stop string's stats missing")
        return OK

    async def n_choices(self, client: Any, rng: random.Random) -> str:
        """``n`` > 1 on the speculating pod: vLLM refuses it greedy, and the CPU build cannot sample
        with speculation (the worker refuses it): a 400 that names the reason, either way."""
        body = {"model": MODEL, "prompt": "The sky", "max_tokens": 8, "temperature": rng.choice([0, 0.8]), "n": 2}
        response = await client.post(self.base + "/v1/completions", json=body)
        if response.status_code == 200:
            check(sorted(c["index"] for c in response.json()["choices"]) == [0, 1], "not two choices")
            return OK
        message = response.json().get("error", {}).get("message", "")
        check(response.status_code == 429 or "n must be 1" in message or "speculative" in message, message[:200])
        return REFUSED

    async def tool_call(self, client: Any, rng: random.Random) -> str:
        choice = {"type": "function", "function": {"name": "get_weather"}}
        body = chat_body("Weather in Oslo?", max_tokens=100, tools=TOOLS, tool_choice=choice)
        response = await client.post(self.base + "/v1/chat/completions", json=body)
        refused = refusal(response, refused=(429,))
        if refused:
            return refused
        (call,) = response.json()["choices"][0]["message"]["tool_calls"]
        check(isinstance(json.loads(call["function"]["arguments"]), dict), "tool arguments are not an object")
        return OK

    async def lora(self, client: Any, rng: random.Random) -> str:
        body = {"model": ADAPTER, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
        response = await client.post(self.base + "/v1/completions", json=body)
        refused = refusal(response, refused=(429,))
        if refused:
            return refused
        check(response.json()["model"] == ADAPTER, "answered by another model")
        return OK

    async def image(self, client: Any, rng: random.Random) -> str:
        url = f"data:image/png;base64,{PNG}" if rng.random() < 0.5 else "http://169.254.169.254/latest/meta-data"
        content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
        body = {**chat_body(""), "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        response = await client.post(self.base + "/v1/chat/completions", json=body)
        check(response.status_code in (400, 429), f"an image part answered {response.status_code}")
        return refusal(response, refused=(400, 429)) or OK

    async def burst(self, client: Any, rng: random.Random) -> list[str]:
        """More requests at once than the pod admits: each is answered or refused with a 429."""
        return list(await asyncio.gather(*(self.completion(client, rng) for _ in range(12))))

    def mix(self) -> list[tuple[Scenario, int]]:
        return [
            (self.chat_stream, 6),
            (self.completion, 5),
            (self.disconnect, 3),
            (self.bad_input, 3),
            (self.stop_string, 3),
            (self.n_choices, 2),
            (self.tool_call, 2),
            (self.lora, 2),
            (self.image, 2),
            (self.burst, 1),
        ]
