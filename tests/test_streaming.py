from collections.abc import AsyncIterator

from worker.schema import StreamChunk, Usage
from worker.streaming import ChunkBatcher, coalesce_events


def _tokens(batcher: ChunkBatcher, n: int) -> list[StreamChunk]:
    out = []
    for i in range(n):
        sent = batcher.add(StreamChunk(text=f"t{i} ", num_tokens=1))
        if sent is not None:
            out.append(sent)
    return out


def test_first_token_goes_out_at_once_then_batches_grow() -> None:
    sent = _tokens(ChunkBatcher(max_batch_size=10, min_batch_size=1, growth_factor=3), 40)
    sizes = [c.num_tokens for c in sent]
    assert sizes[0] == 1
    assert sizes[1:4] == [1, 3, 9]
    assert all(size == 10 for size in sizes[4:])
    assert "".join(c.text for c in sent) == "".join(f"t{i} " for i in range(sum(sizes)))


def test_final_chunk_carries_what_was_pending() -> None:
    batcher = ChunkBatcher(max_batch_size=50, min_batch_size=50, growth_factor=3)
    sent = _tokens(batcher, 5)
    final = batcher.add(
        StreamChunk(
            text="end",
            num_tokens=1,
            finish_reason="stop",
            usage=Usage(prompt_tokens=1, completion_tokens=6, total_tokens=7, cached_prompt_tokens=0),
        )
    )
    assert [c.text for c in sent] == ["t0 "]
    assert final is not None and final.is_final
    assert final.text == "t1 t2 t3 t4 end"
    assert final.usage is not None


def test_empty_text_does_not_spend_the_first_chunk() -> None:
    batcher = ChunkBatcher(max_batch_size=50, min_batch_size=50, growth_factor=3)
    assert batcher.add(StreamChunk(text="", num_tokens=1)) is None
    first = batcher.add(StreamChunk(text="a", num_tokens=1))
    assert first is not None and first.text == "a" and first.num_tokens == 2


def test_batch_size_one_streams_every_step() -> None:
    sent = _tokens(ChunkBatcher(max_batch_size=1, min_batch_size=1, growth_factor=3), 6)
    assert [c.num_tokens for c in sent] == [1] * 6


async def test_events_are_coalesced_on_the_same_schedule_and_nothing_is_lost() -> None:
    async def events() -> AsyncIterator[str]:
        for i in range(20):
            yield f"data: {i}\n\n"

    items = [item async for item in coalesce_events(events(), max_batch_size=5, min_batch_size=1, growth_factor=3)]
    # The first event at once, then 1, 3, 5, 5, ... events an item; the rest at the end.
    assert [item.count("data: ") for item in items] == [1, 1, 3, 5, 5, 5]
    assert "".join(items) == "".join(f"data: {i}\n\n" for i in range(20))
