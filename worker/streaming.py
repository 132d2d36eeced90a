"""Stream coalescing: fewer, larger streamed items for long generations.

Each item a serverless worker yields costs the platform an HTTP POST, so items are
coalesced by token count (OpenAI server-sent events by event count): the first item goes
out at once (time to first token is what users feel), then the batch grows geometrically
from ``min_batch_size`` by ``growth_factor`` up to ``max_batch_size`` tokens, as RunPod's
official worker does.
The final chunk always flushes what is pending, merged into it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from worker.errors import WorkerError
from worker.schema import StreamChunk

__all__ = ["ChunkBatcher", "coalesce_events", "collect_final"]


class _Schedule:
    """The batch sizes: the first item at once, then ``min_batch_size`` growing by ``growth_factor``."""

    def __init__(self, *, max_batch_size: int, min_batch_size: int, growth_factor: float) -> None:
        self._max = max(1, max_batch_size)
        self._batch_size = float(min(max(1, min_batch_size), self._max))
        self._growth = max(1.0, growth_factor)
        self._is_first = True

    def is_due(self, count: int) -> bool:
        return self._is_first or count >= self._batch_size

    def sent(self) -> None:
        if not self._is_first:
            self._batch_size = min(self._batch_size * self._growth, float(self._max))
        self._is_first = False


class ChunkBatcher(_Schedule):
    def __init__(self, *, max_batch_size: int, min_batch_size: int, growth_factor: float) -> None:
        super().__init__(max_batch_size=max_batch_size, min_batch_size=min_batch_size, growth_factor=growth_factor)
        self._texts: list[str] = []
        self._num_tokens = 0

    def add(self, chunk: StreamChunk) -> StreamChunk | None:
        """Take a chunk; return the coalesced chunk to send now, if any."""
        if chunk.is_final:
            self._texts.append(chunk.text)
            merged = replace(chunk, text="".join(self._texts), num_tokens=self._num_tokens + chunk.num_tokens)
            self._texts, self._num_tokens = [], 0
            return merged
        self._texts.append(chunk.text)
        self._num_tokens += chunk.num_tokens
        if not self.is_due(self._num_tokens):
            return None
        text = "".join(self._texts)
        if not text:  # nothing visible yet (e.g. text held back while a stop string may match)
            return None
        self.sent()
        out = StreamChunk(text=text, num_tokens=self._num_tokens)
        self._texts, self._num_tokens = [], 0
        return out


async def coalesce_events(
    events: AsyncIterator[str], *, max_batch_size: int, min_batch_size: int, growth_factor: float
) -> AsyncIterator[str]:
    """Server-sent events joined into fewer items on the same schedule, counted in events (an
    engine step each): the concatenation is still a valid event stream."""
    schedule = _Schedule(max_batch_size=max_batch_size, min_batch_size=min_batch_size, growth_factor=growth_factor)
    pending: list[str] = []
    async for event in events:
        pending.append(event)
        if schedule.is_due(len(pending)):
            yield "".join(pending)
            pending = []
            schedule.sent()
    if pending:
        yield "".join(pending)


async def collect_final(chunks: AsyncIterator[StreamChunk]) -> StreamChunk:
    """Consume a whole request: its final chunk, carrying the whole text."""
    texts: list[str] = []
    final: StreamChunk | None = None
    async for chunk in chunks:
        texts.append(chunk.text)
        final = chunk
    if final is None or not final.is_final:
        raise WorkerError("the engine ended the request without a result")
    return replace(final, text="".join(texts))
