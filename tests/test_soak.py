"""``python -m worker soak``: its figures from known samples, and a 1-minute soak of the real servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.tools.soak.plot import plot
from worker.tools.soak.run import growth, parse_gauges, run_soak


def test_gauges_are_summed_over_labels_and_growth_is_taken_from_the_warmup_mark() -> None:
    page = (
        "# HELP vllm:num_requests_running Number of requests\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
        "vllm:num_requests_waiting_by_reason 7.0\n"
    )
    assert parse_gauges(page) == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 0.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }

    def sample(t_s: float, rss: float, fds: int) -> dict[str, object]:
        return {"t_s": t_s, "processes": {"pod:api": {"rss_mib": rss, "fds": fds, "threads": 9}}}

    samples = [sample(0, 50, 30), sample(60, 100, 40), sample(120, 110, 45), sample(180, 104, 41)]
    (figures,) = growth(samples, warmup_s=60).values()
    assert figures["rss_mib"] == [100, 104] and figures["rss_growth_pct"] == 4.0 and figures["rss_peak_mib"] == 110
    assert figures["fds"] == [40, 41] and figures["fds_peak"] == 45 and figures["threads"] == [9, 9]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_one_minute_soak_loses_nothing_and_leaves_the_engines_idle(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    result = run_soak(minutes=1, out_dir=tmp_path, sample_every_s=5, warmup_minutes=0.25, clients=1, env=subprocess_env)
    summary = result.summary
    assert summary["outcomes"].get("lost", 0) == 0, summary["lost"]
    assert summary["idle_at_end"] and not summary["processes_left"], summary
    for role in ("pod", "serverless"):
        served = {key for key, count in summary["by_scenario"].items() if key.startswith(role) and key.endswith(":ok")}
        assert len(served) >= 4, summary["by_scenario"]
    assert summary["outcomes"]["refused"] > 0  # bad inputs and images are answered with errors, not lost
    roles = {"pod:api", "pod:engine-core", "serverless:api", "serverless:engine-core"}
    assert len(result.samples) >= 10 and all(roles <= set(s["processes"]) for s in result.samples)
    assert {"pod:api", "pod:engine-core", "serverless:api", "serverless:engine-core"} <= set(summary["growth"])
    plot(result, tmp_path / "soak.png")
    assert (tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG"
