"""The acceptance watchdog and the worker's Prometheus page, without an engine."""

from __future__ import annotations

import logging
import multiprocessing
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from worker.config import load_settings
from worker.metrics import AcceptanceWatchdog, WatchdogWindow, WorkerMetrics, render_metrics
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker
from worker.speculation.stats.acceptance import spec_stats_from_histogram


def test_watchdog_waits_for_five_requests_then_warns_once_per_window(caplog: pytest.LogCaptureFixture) -> None:
    watchdog = AcceptanceWatchdog(threshold=1.5, window=10)
    with caplog.at_level(logging.WARNING, logger="worker.metrics"):
        # 10 steps accepting 2 tokens in all: mean acceptance length 1.2, below 1.5.
        warned = [watchdog.observe(num_steps=10, num_accepted=2) for _ in range(4)]
        assert warned == [False] * 4 and not watchdog.is_low  # too few requests to judge
        assert watchdog.observe(num_steps=10, num_accepted=2) is True and watchdog.is_low
        assert watchdog.rolling_mean == pytest.approx(1.2)
        # Still low, but one warning per window of requests, not one per request.
        assert [watchdog.observe(num_steps=10, num_accepted=2) for _ in range(9)] == [False] * 9
        assert watchdog.observe(num_steps=10, num_accepted=2) is True
    warnings = [r for r in caplog.records if "not paying off" in r.getMessage()]
    assert len(warnings) == 2 and "1.20" in warnings[0].getMessage()


def test_watchdog_stays_quiet_when_drafts_pay_and_recovers() -> None:
    watchdog = AcceptanceWatchdog(threshold=1.5, window=5)
    for _ in range(5):
        assert watchdog.observe(num_steps=10, num_accepted=30) is False  # mean 4.0
    assert not watchdog.is_low and watchdog.rolling_mean == pytest.approx(4.0)
    for _ in range(5):
        watchdog.observe(num_steps=10, num_accepted=0)
    assert watchdog.is_low
    for _ in range(5):
        watchdog.observe(num_steps=10, num_accepted=20)  # the window rolls past the bad requests
    assert not watchdog.is_low and watchdog.rolling_mean == pytest.approx(3.0)
    assert watchdog.observe(num_steps=0, num_accepted=0) is False  # a request without speculation
    assert watchdog.rolling_mean == pytest.approx(3.0)


def _observe_in_child(window: WatchdogWindow, num_requests: int) -> None:
    watchdog = AcceptanceWatchdog(threshold=1.5, window=0, memory=window)
    for _ in range(num_requests):
        watchdog.observe(num_steps=10, num_accepted=0)


def test_a_shared_window_pools_the_requests_of_every_process(caplog: pytest.LogCaptureFixture) -> None:
    # The pod's API processes (worker/api_servers.py) each have a watchdog over one shared window:
    # a process that saw only good requests still sees the bad ones another process observed, and
    # the warning comes once per window over all of them, not once per process.
    context = multiprocessing.get_context("spawn")
    window = WatchdogWindow.shared(10, context)
    here = AcceptanceWatchdog(threshold=1.5, window=0, memory=window)  # the window's length wins
    assert here.window == 10
    for _ in range(2):
        here.observe(num_steps=10, num_accepted=30)  # mean 4.0
    child = context.Process(target=_observe_in_child, args=(window, 8))  # mean 1.0 there
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert here.rolling_mean == pytest.approx(1 + 60 / 100)  # 10 requests, 100 steps, 60 accepted
    assert not here.is_low
    with caplog.at_level(logging.WARNING, logger="worker.metrics"):
        # One more bad request here rolls a good one out: 30 accepted in 100 steps, below 1.5.
        assert here.observe(num_steps=10, num_accepted=0) is True and here.is_low
        assert here.rolling_mean == pytest.approx(1.3)
        child = context.Process(target=_observe_in_child, args=(window, 5))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        # The other process's requests counted toward the same window: no second warning yet...
        assert [here.observe(num_steps=10, num_accepted=0) for _ in range(4)] == [False] * 4
        assert here.observe(num_steps=10, num_accepted=0) is True  # ... until 10 more in all
    assert len([r for r in caplog.records if "not paying off" in r.getMessage()]) == 2


def test_metrics_page_shows_what_the_observer_saw() -> None:
    from worker.speculation.stats.tracking import RequestEnd

    metrics = WorkerMetrics(num_spec_tokens=4, threshold=1.5, window=5)
    # 8 verify steps, 0 tokens accepted in 6 of them and 1 in 2: mean acceptance length 1.25.
    stats = spec_stats_from_histogram([6, 2, 0, 0, 0], num_draft_tokens=32, num_spec_tokens=4)
    for i in range(5):
        metrics.observe(RequestEnd(f"r{i}", "finished", "length", stats, 0.02, 9))
    metrics.observe(RequestEnd("r5", "cancelled", None, None, None, 0))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(render_metrics(metrics).decode())
        for s in family.samples
    }
    assert samples[("worker_requests_total", (("outcome", "finished"),))] == 5
    assert samples[("worker_requests_total", (("outcome", "cancelled"),))] == 1
    assert samples[("worker_spec_decode_rolling_mean_acceptance_length", ())] == pytest.approx(1.25)
    assert samples[("worker_spec_decode_low_acceptance", ())] == 1
    assert samples[("worker_request_acceptance_rate_count", ())] == 5


def test_steps_with_speculation_off_are_counted_per_request() -> None:
    from worker.speculation.stats.tracking import RequestEnd

    metrics = WorkerMetrics(num_spec_tokens=4, threshold=1.5, window=5)
    # 30 tokens: the first from the prefill, 4 verify steps yielding 1 + 2 each (12), 17 steps off.
    stats = spec_stats_from_histogram([0, 0, 4, 0, 0], num_draft_tokens=8, num_spec_tokens=4)
    metrics.observe(RequestEnd("a", "finished", "length", stats, 0.02, 30))
    # Speculation off throughout (k = 0): no verify step at all, 9 steps off.
    metrics.observe(
        RequestEnd(
            "b",
            "finished",
            "length",
            spec_stats_from_histogram([0] * 5, num_draft_tokens=0, num_spec_tokens=4),
            0.02,
            10,
        )
    )
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(render_metrics(metrics).decode())
        for s in family.samples
        if not s.labels or (set(s.labels) == {"le"} and s.labels["le"] == "+Inf")
    }
    assert samples["worker_spec_decode_verify_steps_total"] == 4
    assert samples["worker_spec_decode_steps_off_total"] == 17 + 9
    assert samples["worker_request_drafts_per_step_sum"] == 2.0
    assert samples["worker_request_spec_off_fraction_sum"] == pytest.approx(17 / 21 + 1.0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(address: str, port: int) -> bool:
    try:
        return httpx.get(f"http://{address}:{port}/metrics", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize(("host", "is_reachable_elsewhere"), [(None, False), ("0.0.0.0", True)])
def test_serverless_metrics_bind_loopback_unless_metrics_host_says(
    host: str | None, is_reachable_elsewhere: bool
) -> None:
    # 127.0.0.2 is another address of this host: a page bound to 127.0.0.1 alone does not answer there.
    port = _free_port()
    env = {"METRICS_PORT": str(port), **({"METRICS_HOST": host} if host else {})}
    worker = ServerlessWorker(EngineHolder(settings_loader=lambda: load_settings(env)))
    worker.serve_metrics_page()
    assert _answers("127.0.0.1", port)
    assert _answers("127.0.0.2", port) is is_reachable_elsewhere
