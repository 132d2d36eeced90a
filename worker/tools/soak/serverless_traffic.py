"""The handler's scenarios (jobs through the RunPod SDK's local API)."""

from __future__ import annotations

import random
from typing import Any

from worker.tools.soak.traffic import (
    ADAPTER,
    DISCONNECTED,
    MODEL,
    OK,
    PNG,
    REFUSED,
    Scenario,
    chat_body,
    check,
)

__all__ = ["ServerlessTraffic"]


class ServerlessTraffic:
    """Jobs through the SDK's local API: /runsync returns every streamed item of the job."""

    def __init__(self, base: str) -> None:
        self.base = base

    async def _items(self, client: Any, job_input: Any, *, timeout: float | None = None) -> list[Any]:
        kwargs = {} if timeout is None else {"timeout": timeout}
        response = await client.post(self.base + "/runsync", json={"input": job_input}, **kwargs)
        if response.status_code == 422 and not isinstance(job_input, dict):
            # The SDK's local API takes only an object as input; RunPod passes any JSON to the handler.
            return [{"error": str(response.json()["detail"][0]["msg"]), "error_type": "sdk_validation"}]
        check(response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        check(body.get("status") == "COMPLETED", f"job status {body.get('status')}: {str(body)[:200]}")
        output = body["output"]
        check(isinstance(output, list) and len(output) >= 1, "no output")
        return list(output)

    @staticmethod
    def _final(items: list[Any]) -> dict[str, Any]:
        final = items[-1]
        check(isinstance(final, dict) and "error" not in final, f"error item: {str(final)[:300]}")
        check(final["usage"]["completion_tokens"] >= 1, "no usage")
        return dict(final)

    async def native_stream(self, client: Any, rng: random.Random) -> str:
        job = {"prompt": "Once upon a time", "sampling_params": {"max_tokens": rng.randint(4, 48), "temperature": 0}}
        self._final(await self._items(client, job))
        return OK

    async def native_whole(self, client: Any, rng: random.Random) -> str:
        job = {
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": False,
            "sampling_params": {"max_tokens": rng.randint(4, 32), "temperature": 0.7, "seed": rng.randrange(1000)},
        }
        items = await self._items(client, job)
        check(len(items) == 1, "a whole answer came in pieces")
        self._final(items)
        return OK

    async def stop_string(self, client: Any, rng: random.Random) -> str:
        job = {
            "prompt": "He counted one, two,",
            "sampling_params": {"max_tokens": 60, "temperature": 0, "stop": ["seven"]},
        }
        final = self._final(await self._items(client, job))
        check(final["stop_reason"] == "seven", f"no stop: {final.get('finish_reason')}")
        return OK

    async def bad_input(self, client: Any, rng: random.Random) -> str:
        job = rng.choice(
            [
                {"prompt": "x", "sampling_params": {"top_k": "many"}},
                {"prompt": 5},
                {"messages": [{"role": "robot", "content": "x"}]},
                "not an object",
                {"openai_route": "/v1/nothing", "openai_input": {}},
            ]
        )
        items = await self._items(client, job)
        check(isinstance(items[-1], dict) and isinstance(items[-1].get("error"), str), f"not refused: {items[-1]}")
        return REFUSED

    async def openai_chat(self, client: Any, rng: random.Random) -> str:
        streamed = rng.random() < 0.5
        body = chat_body("Hello", max_tokens=rng.randint(4, 24), stream=streamed)
        items = await self._items(client, {"openai_route": "/v1/chat/completions", "openai_input": body})
        if streamed:
            check(all(isinstance(i, str) for i in items) and items[-1].endswith("data: [DONE]\n\n"), "no [DONE]")
        else:
            check(items[0]["usage"]["completion_tokens"] >= 1, "no usage")
        return OK

    async def n_choices(self, client: Any, rng: random.Random) -> str:
        body = {
            "model": MODEL,
            "prompt": "The sky",
            "max_tokens": 8,
            "temperature": 0.8,
            "n": 2,
            "seed": rng.randrange(1000),
        }
        items = await self._items(client, {"openai_route": "/v1/completions", "openai_input": body})
        check(sorted(c["index"] for c in items[0]["choices"]) == [0, 1], "not two choices")
        return OK

    async def lora(self, client: Any, rng: random.Random) -> str:
        job = {"prompt": "Once upon a time", "lora": ADAPTER, "sampling_params": {"max_tokens": 12, "temperature": 0}}
        self._final(await self._items(client, job))
        return OK

    async def image(self, client: Any, rng: random.Random) -> str:
        content = [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]
        body = {**chat_body(""), "messages": [{"role": "user", "content": content}], "max_tokens": 8}
        items = await self._items(client, {"openai_route": "/v1/chat/completions", "openai_input": body})
        check(isinstance(items[-1], dict) and isinstance(items[-1].get("error"), str), "an image part was served")
        return REFUSED

    async def run_then_stream(self, client: Any, rng: random.Random) -> str:
        """/run, then /stream/{id}: the SDK's local API runs the job when its stream is asked for."""
        job = {"prompt": "Once upon a time", "sampling_params": {"max_tokens": 16, "temperature": 0}}
        queued = (await client.post(self.base + "/run", json={"input": job})).json()
        body = (await client.post(self.base + f"/stream/{queued['id']}")).json()
        check(body.get("status") == "COMPLETED", f"stream status {body.get('status')}")
        self._final([item["output"] for item in body["stream"]])
        return OK

    async def disconnect(self, client: Any, rng: random.Random) -> str:
        """The client gives up on a job mid-way (the local API, unlike RunPod, has no cancel: the job
        still runs to its end in the worker)."""
        job = {"prompt": "Count", "sampling_params": {"max_tokens": 120, "ignore_eos": True, "temperature": 0}}
        import httpx

        try:
            await self._items(client, job, timeout=rng.uniform(0.05, 0.5))
        except httpx.TimeoutException:
            return DISCONNECTED
        return OK

    def mix(self) -> list[tuple[Scenario, int]]:
        return [
            (self.native_stream, 6),
            (self.native_whole, 4),
            (self.stop_string, 3),
            (self.bad_input, 3),
            (self.openai_chat, 3),
            (self.n_choices, 2),
            (self.lora, 2),
            (self.image, 1),
            (self.run_then_stream, 2),
            (self.disconnect, 2),
        ]
