"""Prometheus metrics of the worker, fed by the engine's request observers.

Beside vLLM's own engine metrics (``vllm:*``, which vLLM registers in prometheus_client's
default registry), the worker exports per-request distributions that vLLM aggregates away:

    worker_request_acceptance_length      histogram of per-request mean acceptance length
    worker_request_acceptance_rate        histogram of per-request draft acceptance rate
    worker_time_to_first_token_seconds    histogram
    worker_requests_total{outcome}        finished / cancelled / error
    worker_spec_decode_releases_total{outcome,reason}   stop strings' final outputs: exact (answered),
                                          partial (no_answer, unmatched, engine_error, holding_off)
    worker_spec_decode_rolling_mean_acceptance_length   gauge over the watchdog window
    worker_spec_decode_low_acceptance     gauge: 1 while the window is below the threshold
    worker_requests_in_engine             gauge, read at scrape time: requests the engine holds
    worker_spec_decode_verify_steps_total counter: steps that verified drafts, of finished requests
    worker_spec_decode_steps_off_total    counter: steps that verified none (speculation off: k = 0
                                          chosen by SPECULATION_CONTROL=auto or the schedule, or no
                                          n-gram match), of finished requests
    worker_request_drafts_per_step        histogram of per-request drafts verified per verify step
                                          (the k chosen for it, on average)
    worker_request_spec_off_fraction      histogram of per-request share of decode steps without drafts

The acceptance watchdog keeps a rolling window of the last ``window`` speculated requests.
When the window's mean acceptance length (1 + accepted / steps, pooled over its requests)
falls below ``threshold`` it sets the gauge and logs one warning per window, not per request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, MutableSequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.metrics_core import Metric

from worker.speculation.stats.acceptance import mean_acceptance_length

if TYPE_CHECKING:
    from worker.speculation.stats.tracking import RequestEnd

__all__ = [
    "AcceptanceWatchdog",
    "WatchdogWindow",
    "WorkerMetrics",
    "is_multiprocess",
    "render_metrics",
    "serve_metrics_page",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WatchdogWindow:
    """The watchdog's rolling window: a ring of (steps, accepted) per request, and ``meta`` =
    [next slot, slots filled, requests since the last warning], under ``lock``. In plain lists for
    one process; in shared memory (:meth:`shared`) when several API processes serve one engine,
    so that the window pools every process's requests and the warning is logged once per window."""

    steps: MutableSequence[int]
    accepted: MutableSequence[int]
    meta: MutableSequence[int]
    lock: AbstractContextManager[Any]

    @classmethod
    def local(cls, window: int) -> WatchdogWindow:
        return cls([0] * window, [0] * window, [0, 0, window], contextlib.nullcontext())

    @classmethod
    def shared(cls, window: int, context: Any) -> WatchdogWindow:
        """In ``context``'s shared memory (a ``multiprocessing`` context), handed to its processes."""
        meta = context.RawArray("q", 3)
        meta[2] = window
        return cls(context.RawArray("q", window), context.RawArray("q", window), meta, context.Lock())


class AcceptanceWatchdog:
    def __init__(self, *, threshold: float, window: int, memory: WatchdogWindow | None = None) -> None:
        """Defaults live in ``Settings`` (``ACCEPTANCE_WATCHDOG_THRESHOLD`` / ``_WINDOW``); ``memory``:
        a window shared with other processes (its length is the window)."""
        self.threshold = threshold
        self.window = max(1, window) if memory is None else len(memory.steps)
        self._memory = WatchdogWindow.local(self.window) if memory is None else memory
        self.is_low = False

    @property
    def rolling_mean(self) -> float | None:
        with self._memory.lock:
            return self._mean()[0]

    def _mean(self) -> tuple[float | None, int]:
        m = self._memory
        filled = m.meta[1]
        steps = sum(m.steps[:filled])
        if not steps:
            return None, filled
        return mean_acceptance_length(num_accepted=sum(m.accepted[:filled]), num_steps=steps), filled

    def observe(self, *, num_steps: int, num_accepted: int) -> bool:
        """Record a request; return True when this call logged a warning."""
        if num_steps <= 0:
            return False
        m = self._memory
        with m.lock:
            slot = m.meta[0]
            m.steps[slot], m.accepted[slot] = num_steps, num_accepted
            m.meta[0] = (slot + 1) % self.window
            m.meta[1] = min(self.window, m.meta[1] + 1)
            m.meta[2] += 1
            mean, filled = self._mean()
            self.is_low = mean is not None and filled >= min(self.window, 5) and mean < self.threshold
            should_warn = self.is_low and m.meta[2] >= self.window
            if should_warn:
                m.meta[2] = 0
        if should_warn:
            log.warning(
                "speculative decoding is not paying off: mean acceptance length %.2f over the last %d requests "
                "is below %.2f (fewer than %.2f accepted draft tokens per step); consider a better draft, "
                "fewer speculative tokens, or none",
                mean,
                filled,
                self.threshold,
                self.threshold - 1,
            )
        return should_warn


def is_multiprocess() -> bool:
    """Whether prometheus_client keeps its values in files shared by processes (vLLM sets
    ``PROMETHEUS_MULTIPROC_DIR`` for several API server processes; ``worker/api_servers.py`` too)."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ


class WorkerMetrics:
    def __init__(
        self, *, num_spec_tokens: int | None, threshold: float, window: int, shared_window: WatchdogWindow | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._count_in_engine: Callable[[], float] | None = None
        k = max(1, num_spec_tokens or 8)
        length_buckets = sorted({1.0 + i * 0.25 for i in range(int(k * 4) + 1)})
        self.acceptance_length = Histogram(
            "worker_request_acceptance_length",
            "Per-request mean acceptance length (tokens per verify step)",
            buckets=length_buckets,
            registry=self.registry,
        )
        self.acceptance_rate = Histogram(
            "worker_request_acceptance_rate",
            "Per-request draft acceptance rate",
            buckets=[i / 10 for i in range(11)],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "worker_time_to_first_token_seconds",
            "Time to first token, from request arrival",
            buckets=[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
            registry=self.registry,
        )
        self.requests = Counter("worker_requests", "Requests by outcome", ["outcome"], registry=self.registry)
        self.releases = Counter(
            "worker_spec_decode_releases",
            "Final outputs of requests ended by a stop string, by how their spec-decode counts went out",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.rolling_length = Gauge(
            "worker_spec_decode_rolling_mean_acceptance_length",
            "Mean acceptance length over the watchdog window",
            registry=self.registry,
            multiprocess_mode="mostrecent",  # the window is shared: the latest value of any process
        )
        self.low_acceptance = Gauge(
            "worker_spec_decode_low_acceptance",
            "1 while the rolling mean acceptance length is below the threshold",
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.in_engine = Gauge(
            "worker_requests_in_engine",
            "Requests the engine holds (running or waiting)",
            registry=self.registry,
            multiprocess_mode="livesum",  # each API process's own requests, summed over live processes
        )
        self.verify_steps = Counter(
            "worker_spec_decode_verify_steps", "Decode steps that verified drafts", registry=self.registry
        )
        self.steps_off = Counter(
            "worker_spec_decode_steps_off",
            "Decode steps that verified no drafts (speculation off for the request)",
            registry=self.registry,
        )
        self.drafts_per_step = Histogram(
            "worker_request_drafts_per_step",
            "Per-request drafts verified per verify step (the k chosen for it, on average)",
            buckets=sorted({i * 0.5 for i in range(2 * k + 1)}),
            registry=self.registry,
        )
        self.off_fraction = Histogram(
            "worker_request_spec_off_fraction",
            "Per-request share of decode steps that verified no drafts",
            buckets=[0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0],
            registry=self.registry,
        )
        self.watchdog = AcceptanceWatchdog(threshold=threshold, window=window, memory=shared_window)

    def count_in_engine(self, count: Callable[[], float]) -> None:
        """Read ``worker_requests_in_engine`` from ``count`` at every scrape; with several processes,
        whenever :meth:`refresh` runs (a scrape reads other processes' files, not their functions)."""
        if is_multiprocess():
            self._count_in_engine = count
            self.refresh()
        else:
            self.in_engine.set_function(count)

    def refresh(self) -> None:
        """Write the values read from functions to the shared files (several processes only)."""
        if self._count_in_engine is not None:
            self.in_engine.set(self._count_in_engine())

    def observe(self, end: RequestEnd) -> None:
        """An engine request observer."""
        self.requests.labels(outcome=end.outcome).inc()
        if end.release is not None:
            self.releases.labels(outcome=end.release.outcome, reason=end.release.reason).inc()
        if end.time_to_first_token_s is not None:
            self.ttft.observe(end.time_to_first_token_s)
        stats = end.spec_decode
        if stats is not None and not stats.partial:
            # Every token after the first comes from a decode step; a verify step yields 1 + accepted.
            yielded = stats.num_spec_steps + stats.num_accepted_draft_tokens
            steps_off = max(0, end.num_completion_tokens - 1 - yielded)
            self.verify_steps.inc(stats.num_spec_steps)
            self.steps_off.inc(steps_off)
            if steps_off + stats.num_spec_steps:
                self.off_fraction.observe(steps_off / (steps_off + stats.num_spec_steps))
        if stats is None or stats.mean_acceptance_length is None:  # no verify step: nothing to observe
            return
        self.drafts_per_step.observe(stats.num_draft_tokens / stats.num_spec_steps)
        self.acceptance_length.observe(stats.mean_acceptance_length)
        if stats.draft_acceptance_rate is not None:
            self.acceptance_rate.observe(stats.draft_acceptance_rate)
        self.watchdog.observe(num_steps=stats.num_spec_steps, num_accepted=stats.num_accepted_draft_tokens)
        mean = self.watchdog.rolling_mean
        if mean is not None:
            self.rolling_length.set(mean)
        self.low_acceptance.set(1 if self.watchdog.is_low else 0)


class _OnePage:
    """vLLM's registry and the worker's (once the engine has booted) as one collector: the pod's
    ``/metrics`` and the serverless ``METRICS_PORT`` page are this one page."""

    def __init__(self, worker_metrics: Callable[[], WorkerMetrics | None]) -> None:
        self._worker_metrics = worker_metrics

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        metrics = self._worker_metrics()
        if metrics is not None:
            yield from metrics.registry.collect()


def _page(worker_metrics: Callable[[], WorkerMetrics | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_OnePage(worker_metrics))
    return registry


def render_metrics(metrics: WorkerMetrics | None) -> bytes:
    """The metrics page: vLLM's metrics (its default registry) followed by the worker's; with
    several processes, both as every process wrote them to the shared files, summed (vLLM's
    ``get_prometheus_registry`` reads them the same way)."""
    if is_multiprocess():
        if metrics is not None:
            metrics.refresh()
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(_page(lambda: metrics))


def serve_metrics_page(port: int, worker_metrics: Callable[[], WorkerMetrics | None], *, host: str) -> None:
    """The pod's /metrics page on ``host``:``port`` (serverless ``METRICS_HOST``, ``METRICS_PORT``),
    served by prometheus_client's own HTTP server on a daemon thread."""
    start_http_server(port, addr=host, registry=_page(worker_metrics))
