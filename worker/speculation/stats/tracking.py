"""The books of one request: its first token, its token count, and how it ended (told to the
engine's observers exactly once), kept alike on the native path and under vLLM's OpenAI layer."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal, Protocol

from worker.schema import SpecDecodeStats, Timings
from worker.speculation.stats.acceptance import spec_stats_from_histogram

__all__ = ["Release", "ReleaseReason", "Released", "RequestEnd", "RequestTracker"]

# Why a stop string's final output went out as it did (``worker.vllm_internals.frontend``): with the
# core's answer (exact), or partial: no answer in time, an answer whose last steps did not match,
# the engine failing while it waited, or holding switched off for the engine's life.
ReleaseReason = Literal["answered", "no_answer", "unmatched", "engine_error", "holding_off"]


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """How the frontend released a stop string's final output: its ``reason``, how long it was held,
    and what it took off (the outputs after the stop string, and of vLLM's spec-decode counters the
    verify steps, draft tokens and accepted tokens those steps had added)."""

    reason: ReleaseReason
    held_s: float = 0.0
    num_outputs_taken_off: int = 0
    taken_off: tuple[int, int, int] = (0, 0, 0)

    @property
    def is_exact(self) -> bool:
        return self.reason == "answered"

    @property
    def outcome(self) -> Literal["exact", "partial"]:
        return "exact" if self.is_exact else "partial"


class Released:
    """The mark on the spec-decode counts a stop string's final output went out with: how it was
    released. The seam's frontend gives its copies of vLLM's counts this base; vLLM's own counts
    lack it, so a tracker tells the two apart by type (vLLM's class is not read for a name)."""

    release: Release = Release("answered")


@dataclasses.dataclass(frozen=True, slots=True)
class RequestEnd:
    """How a request ended, for observers (metrics, logs); ``release``: how the frontend released
    its final output, for a request it finished on a stop string (else None)."""

    request_id: str
    outcome: str  # "finished", "cancelled", "error"
    finish_reason: str | None
    spec_decode: SpecDecodeStats | None
    time_to_first_token_s: float | None
    num_completion_tokens: int
    release: Release | None = None


class _Books(Protocol):
    """What a tracker needs of the engine: whether it keeps stats, vLLM's request state, its observers."""

    @property
    def keeps_spec_stats(self) -> bool: ...

    def request_state(self, request_id: str) -> Any: ...

    def notify(self, end: RequestEnd) -> None: ...


class RequestTracker:
    """The books of one request, kept the same way by ``Engine.generate`` and ``Engine.observe``.
    Plain method calls: no generator frame is added on the hot path."""

    __slots__ = ("_books", "_end", "_first_token_at", "_start", "_state", "num_tokens", "request_id")

    def __init__(self, books: _Books, request_id: str) -> None:
        self._books = books
        self.request_id = request_id
        self._start = time.perf_counter()
        self._first_token_at: float | None = None
        self.num_tokens = 0
        # vLLM's frontend state of the request holds the latest spec-decode snapshot, which a
        # cancelled request reports: looked up once, and only when there is something to report.
        self._state: Any = None if books.keeps_spec_stats else False
        self._end: RequestEnd | None = None

    def add(self, num_new: int) -> None:
        """An engine output with ``num_new`` tokens arrived."""
        if self._state is None:
            self._state = self._books.request_state(self.request_id)
        if num_new and self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        self.num_tokens += num_new

    def finish(self, completion: Any, *, stats: Any = None) -> SpecDecodeStats | None:
        """The request finished with ``completion`` (None: several choices); its exact stats.
        ``stats``: vLLM's request stats (``RequestOutput.metrics``), whose time to first token is
        the engine's own: a request vLLM's layer does not stream gets one output, at the end, so
        the first output seen here is no first token (it comes at the end)."""
        if self._end is not None:
            return self._end.spec_decode
        engine_ttft = stats.first_token_latency if stats is not None else 0.0
        ttft = engine_ttft if engine_ttft > 0 else self._ttft()
        metrics = completion.spec_decode_metrics if completion is not None else None
        finish_reason = completion.finish_reason if completion is not None else "stop"
        # Partial: a cancellation, or a stop string whose exact counts did not come (worker.vllm_internals.frontend).
        release = metrics.release if isinstance(metrics, Released) else None
        is_partial = finish_reason == "abort" or (release is not None and not release.is_exact)
        spec = None if metrics is None else stats_from_vllm(metrics, is_partial=is_partial)
        # Observers hear of the end now, not when the consumer gets round to closing the stream.
        end = RequestEnd(self.request_id, "finished", finish_reason, spec, ttft, self.num_tokens, release)
        self._tell(end)
        return spec

    def cancel(self) -> None:
        """The consumer went away (a request closed after its final output is not cut short)."""
        if self._end is None:
            metrics = self._state.spec_decode_metrics if self._state else None
            observed = None if metrics is None else stats_from_vllm(metrics, is_partial=True)
            self._tell(RequestEnd(self.request_id, "cancelled", None, observed, self._ttft(), self.num_tokens))

    def fail(self) -> None:
        """Called last, whatever happened: a request that neither finished nor was cancelled failed."""
        if self._end is None:
            self._tell(RequestEnd(self.request_id, "error", None, None, self._ttft(), self.num_tokens))

    def timings(self, output: Any, *, now: float) -> Timings:
        queue_ms = None
        stats = output.metrics
        queued, scheduled = (stats.queued_ts, stats.scheduled_ts) if stats is not None else (0.0, 0.0)
        if queued and scheduled:
            queue_ms = max(0.0, (scheduled - queued) * 1000)
        first = self._first_token_at
        decode_rate = None
        if first is not None and self.num_tokens > 1 and now > first:
            decode_rate = (self.num_tokens - 1) / (now - first)
        return Timings(
            queue_ms=queue_ms,
            time_to_first_token_ms=None if first is None else (first - self._start) * 1000,
            decode_tokens_per_s=decode_rate,
            end_to_end_ms=(now - self._start) * 1000,
        )

    def _ttft(self) -> float | None:
        return None if self._first_token_at is None else self._first_token_at - self._start

    def _tell(self, end: RequestEnd) -> None:
        self._end = end
        self._books.notify(end)


def stats_from_vllm(metrics: Any, *, is_partial: bool) -> SpecDecodeStats:
    """vLLM's per-request spec-decode metrics as the worker's stats block."""
    return spec_stats_from_histogram(
        metrics.histogram,
        num_draft_tokens=metrics.num_draft_tokens,
        num_spec_tokens=metrics.num_spec_tokens,
        is_partial=is_partial,
        per_step_accepted=metrics.per_step_accepted or None,
        per_step_drafted=metrics.per_step_drafted or None,
    )
