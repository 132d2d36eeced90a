"""Prometheus metrics of the worker, fed by the engine's request observers.

Beside vLLM's own engine metrics (``vllm:*``, which vLLM registers in prometheus_client's
default registry), the worker exports per-request distributions that vLLM aggregates away:

    worker_request_acceptance_length      histogram of per-request mean acceptance length
    worker_request_acceptance_rate        histogram of per-request draft acceptance rate
    worker_time_to_first_token_seconds    histogram
    worker_requests_total{outcome}        finished / cancelled / error
    worker_spec_decode_rolling_mean_acceptance_length   gauge over the watchdog window
    worker_spec_decode_low_acceptance     gauge: 1 while the window is below the threshold
    worker_requests_in_engine             gauge, read at scrape time: requests the engine holds

The acceptance watchdog keeps a rolling window of the last ``window`` speculated requests.
When the window's mean acceptance length (1 + accepted / steps, pooled over its requests)
falls below ``threshold`` it sets the gauge and logs one warning per window, not per request.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric

from worker.stats import mean_acceptance_length

if TYPE_CHECKING:
    from worker.tracking import RequestEnd

__all__ = ["AcceptanceWatchdog", "WorkerMetrics", "render_metrics", "serve_metrics_page"]

log = logging.getLogger(__name__)


class AcceptanceWatchdog:
    def __init__(self, *, threshold: float, window: int) -> None:
        """Defaults live in ``Settings`` (``ACCEPTANCE_WATCHDOG_THRESHOLD`` / ``_WINDOW``)."""
        self.threshold = threshold
        self.window = max(1, window)
        self._steps: deque[tuple[int, int]] = deque(maxlen=self.window)  # (num_steps, num_accepted)
        self._since_warning = self.window
        self.is_low = False

    @property
    def rolling_mean(self) -> float | None:
        steps = sum(s for s, _ in self._steps)
        if not steps:
            return None
        return mean_acceptance_length(num_accepted=sum(a for _, a in self._steps), num_steps=steps)

    def observe(self, *, num_steps: int, num_accepted: int) -> bool:
        """Record a request; return True when this call logged a warning."""
        if num_steps <= 0:
            return False
        self._steps.append((num_steps, num_accepted))
        self._since_warning += 1
        mean = self.rolling_mean
        self.is_low = mean is not None and len(self._steps) >= min(self.window, 5) and mean < self.threshold
        if self.is_low and self._since_warning >= self.window:
            self._since_warning = 0
            log.warning(
                "speculative decoding is not paying off: mean acceptance length %.2f over the last %d requests "
                "is below %.2f (fewer than %.2f accepted draft tokens per step); consider a better draft, "
                "fewer speculative tokens, or none",
                mean,
                len(self._steps),
                self.threshold,
                self.threshold - 1,
            )
            return True
        return False


class WorkerMetrics:
    def __init__(self, *, num_spec_tokens: int | None, threshold: float, window: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
        self.rolling_length = Gauge(
            "worker_spec_decode_rolling_mean_acceptance_length",
            "Mean acceptance length over the watchdog window",
            registry=self.registry,
        )
        self.low_acceptance = Gauge(
            "worker_spec_decode_low_acceptance",
            "1 while the rolling mean acceptance length is below the threshold",
            registry=self.registry,
        )
        self.in_engine = Gauge(
            "worker_requests_in_engine", "Requests the engine holds (running or waiting)", registry=self.registry
        )
        self.watchdog = AcceptanceWatchdog(threshold=threshold, window=window)

    def count_in_engine(self, count: Callable[[], float]) -> None:
        """Read ``worker_requests_in_engine`` from ``count`` at every scrape."""
        self.in_engine.set_function(count)

    def observe(self, end: RequestEnd) -> None:
        """An engine request observer."""
        self.requests.labels(outcome=end.outcome).inc()
        if end.time_to_first_token_s is not None:
            self.ttft.observe(end.time_to_first_token_s)
        stats = end.spec_decode
        if stats is None or stats.num_spec_steps == 0:
            return
        self.acceptance_length.observe(stats.mean_acceptance_length)
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
    """The metrics page: vLLM's metrics (its default registry) followed by the worker's."""
    return generate_latest(_page(lambda: metrics))


def serve_metrics_page(port: int, worker_metrics: Callable[[], WorkerMetrics | None]) -> None:
    """The pod's /metrics page on 127.0.0.1:``port`` (serverless ``METRICS_PORT``), served by
    prometheus_client's own HTTP server on a daemon thread."""
    start_http_server(port, addr="127.0.0.1", registry=_page(worker_metrics))
