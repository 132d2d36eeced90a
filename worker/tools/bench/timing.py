"""Timing one request and a concurrency level: the measurements every part shares."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]  # the repository


PROMPT = "Once upon a time"


@dataclass(slots=True)
class RequestTiming:
    start: float
    first_token: float | None = None
    end: float | None = None
    num_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def itl(self) -> float | None:
        if self.first_token is None or self.end is None or self.num_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.num_tokens - 1)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize(timings: list[RequestTiming], wall: float) -> dict[str, Any]:
    ttfts = [t.ttft for t in timings if t.ttft is not None]
    itls = [t.itl for t in timings if t.itl is not None]
    tokens = sum(t.num_tokens for t in timings)
    return {
        "requests": len(timings),
        "tokens": tokens,
        "wall_s": wall,
        "throughput_tok_s": tokens / wall if wall > 0 else None,
        "ttft_p50_ms": _ms(_pct(ttfts, 50)),
        "ttft_p99_ms": _ms(_pct(ttfts, 99)),
        "itl_mean_ms": _ms(statistics.fmean(itls)) if itls else None,
        "itl_p50_ms": _ms(_pct(itls, 50)),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


async def run_concurrent(
    make: Callable[[int], Any], *, num_requests: int, concurrency: int
) -> tuple[list[RequestTiming], float]:
    semaphore = asyncio.Semaphore(concurrency)
    timings: list[RequestTiming] = []

    async def one(i: int) -> None:
        async with semaphore:
            timing = RequestTiming(start=time.perf_counter())
            await make(i)(timing)
            timings.append(timing)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(num_requests)))
    return timings, time.perf_counter() - started


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if not ours or not theirs else ours / theirs


# ------------------------------------------------------------------------------ overhead
def requests_for(concurrency: int, num_requests: int) -> int:
    """``num_requests``, or with 0 ("auto") two waves of the concurrency level (at least 8)."""
    return num_requests or max(8, 2 * concurrency)


def median(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if numbers else None
