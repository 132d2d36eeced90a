"""How a draft model's skipped KV is caught up: the missing ranges packed into passes within the
engine's token budget (``worker.vllm_internals.draft_skip`` runs them). Plain Python: tested
without a GPU."""

from __future__ import annotations

__all__ = ["pack_ranges"]


def pack_ranges(ranges: list[tuple[int, int, int]], budget: int) -> list[list[tuple[int, int, int]]]:
    """``(row, start, end)`` ranges of positions packed into passes of at most ``budget`` tokens,
    in order; a range longer than what is left of a pass is split, its pieces in later passes (each
    pass attends to the KV the ones before it wrote)."""
    passes: list[list[tuple[int, int, int]]] = []
    current: list[tuple[int, int, int]] = []
    room = budget
    pending = list(ranges)
    while pending:
        row, start, end = pending.pop(0)
        take = min(end - start, room)
        current.append((row, start, start + take))
        room -= take
        if start + take < end:
            pending.insert(0, (row, start + take, end))
        if room == 0:
            passes.append(current)
            current, room = [], budget
    if current:
        passes.append(current)
    return passes
