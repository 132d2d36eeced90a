"""Test doubles for failures a real engine cannot produce on demand.

:class:`FakeEngine` is a *fake*: it yields canned text and can die mid-stream or hang. It
satisfies ``worker.runtime.EngineProtocol``, the surface the entrypoints use (strict mypy checks
it where the tests hand it to them). Engine behaviour itself is tested against the real vLLM
engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from worker.errors import EngineDead
from worker.schema import GenerateRequest, Served, StreamChunk, Timings, Usage

__all__ = ["FakeEngine"]


class FakeEngine:
    def __init__(self, *, words: int = 5, die_after: int | None = None, delay_s: float = 0.0) -> None:
        self.words = words
        self.die_after = die_after
        self.delay_s = delay_s
        self.max_num_seqs = 4
        self.max_model_len = 1024
        self.num_unfinished_requests = 0
        self.is_dead = False
        self.observers: list[Any] = []
        self.served = Served(
            model="fake",
            quantization=None,
            speculative_method=None,
            num_speculative_tokens=None,
            speculation_control=None,
            model_runner="cpu",
            cudagraph_mode=None,
            torch_compile=None,
            speculative_tokens_by_batch=None,
            spec_decode_available=False,
        )

    async def generate(
        self, request: GenerateRequest, *, request_id: str | None = None
    ) -> AsyncGenerator[StreamChunk, None]:
        if self.is_dead:
            raise EngineDead("the inference engine has died")
        self.num_unfinished_requests += 1
        try:
            for i in range(self.words):
                if self.die_after is not None and i == self.die_after:
                    self.is_dead = True
                    raise EngineDead("the inference engine died while serving this request")
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                yield StreamChunk(text=f"w{i} ", num_tokens=1)
            yield StreamChunk(
                text="",
                num_tokens=0,
                finish_reason="length",
                usage=Usage(
                    prompt_tokens=1, completion_tokens=self.words, total_tokens=self.words + 1, cached_prompt_tokens=0
                ),
                timings=Timings(queue_ms=0.0, time_to_first_token_ms=0.0, decode_tokens_per_s=None, end_to_end_ms=0.0),
                served=self.served,
            )
        finally:
            self.num_unfinished_requests -= 1

    def shutdown(self) -> None:
        pass

    def mark_dead(self) -> None:
        self.is_dead = True
