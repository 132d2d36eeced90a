"""The benchmark harness at tiny sizes: complete, sane results (not speed thresholds)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from worker.tools.bench.coldstart import parse_boot_log
from worker.tools.bench.report import render_markdown, render_saved
from worker.tools.bench.timing import RequestTiming, summarize

ROOT = Path(__file__).resolve().parent.parent


def test_summarize() -> None:
    timings = [
        RequestTiming(start=0.0, first_token=0.1, end=1.1, num_tokens=11),
        RequestTiming(start=0.0, first_token=0.3, end=1.3, num_tokens=6),
    ]
    s = summarize(timings, wall=2.0)
    assert s["tokens"] == 17 and s["throughput_tok_s"] == 8.5
    # Nearest rank: index round(0.5 * (2 - 1)) = 0 (round half to even), the lower of the two.
    assert s["ttft_p50_ms"] == pytest.approx(100.0) and s["ttft_p99_ms"] == pytest.approx(300.0)
    assert s["itl_mean_ms"] == pytest.approx((100.0 + 200.0) / 2)


def test_parse_boot_log() -> None:
    log = (
        "x Loading weights took 1.25 seconds\ny init engine (profile, create kv cache, warmup model) took 7.50 seconds"
    )
    assert parse_boot_log(log) == {"weights_load_s": 1.25, "engine_init_s": 7.5}


def test_render_saved_gpu_results(tmp_path: Path) -> None:
    """Saved results render to tables whose cells are the JSON's own figures (read here, not copied)."""
    results = ROOT / "docs" / "gpu-results"
    bf16 = json.loads((results / "bf16.json").read_text())
    # The same results with an engine that sent an output per 8 tokens, under another name.
    si8 = {**bf16, "overhead": {**bf16["overhead"], "stream_interval": 8}}
    (tmp_path / "si8.json").write_text(json.dumps(si8))
    text = render_saved([results / "bf16.json", tmp_path / "si8.json", results / "pod.json"])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    by_c = {r["concurrency"]: r for r in bf16["overhead"]["rows"]}
    ratios = f"{by_c[1]['throughput_ratio']:.3f} / {by_c[256]['throughput_ratio']:.3f}"
    assert rows["bf16"].endswith(ratios + " |") and f"{by_c[256]['handler']['throughput_tok_s']:,.0f}" in rows["bf16"]
    assert rows["si8 (stream interval 8)"].endswith(ratios + " |")
    assert "Engine stream interval: 8 token(s) per output" in text
    pod_row = json.loads((results / "pod.json").read_text())["pod"]["rows"][-1]
    assert "#### pod (`pod.json`)" in text
    assert f"| {pod_row['concurrency']} | {pod_row['pod']['throughput_tok_s']:,.1f} |" in text


@pytest.mark.timeout(900)
def test_smoke_run_produces_complete_results(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "bench", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "bench.json").read_text())
    assert set(results) >= {"overhead", "pod", "coldstart", "spec", "roofline", "command", "machine"}

    def positive(value: float | None) -> bool:
        return value is not None and math.isfinite(value) and value > 0

    for part in ("overhead", "pod"):
        rows = results[part]["rows"]
        assert [r["concurrency"] for r in rows] == [1, 2]
        for row in rows:
            assert positive(row["throughput_ratio"]) and positive(row["ttft_p50_ratio"])
            for side in [k for k in row if isinstance(row[k], dict)]:
                assert row[side]["tokens"] == 4 * 16  # ignore_eos: every request ran to max_tokens
    cold = results["coldstart"]
    assert positive(cold["handler"]["first_token_s"]) and positive(cold["vllm_server"]["first_token_s"])
    assert 0 < cold["handler_import_s"] < 5
    first = results["first_request"]
    assert positive(first["first_ttft_ms"]) and len(first["after_ttfts_ms"]) == 5 and first["warmup_request"]
    assert first["ratio"] == pytest.approx(first["first_ttft_ms"] / first["steady_ttft_ms"])
    (row,) = results["spec"]["rows"]
    assert row["draft"] == "tiny:noisy" and row["k"] == 2
    assert row["num_accepted_draft_tokens"] <= row["num_draft_tokens"] and row["num_spec_steps"] > 0
    assert row["mean_acceptance_length"] == pytest.approx(1 + row["num_accepted_draft_tokens"] / row["num_spec_steps"])
    # vLLM's engine-wide counters agree with the per-request sums over the measured requests.
    assert row["engine_counters"] == {
        "num_drafts": row["num_spec_steps"],
        "num_draft_tokens": row["num_draft_tokens"],
        "num_accepted_tokens": row["num_accepted_draft_tokens"],
    }
    assert positive(results["roofline"]["weight_bytes_per_step"])
    markdown = (out / "bench.md").read_text()
    assert "Handler overhead" in markdown and "python -m worker bench --smoke" in markdown
    assert (out / "throughput.png").stat().st_size > 0 and (out / "speculative.png").stat().st_size > 0


def test_render_shows_the_aa_control_beside_the_stats_cost() -> None:
    side = {"throughput_tok_s": 1000.0, "ttft_p50_ms": 5.0, "itl_mean_ms": 2.0}
    row = {
        "concurrency": 8,
        "handler": side,
        "vllm_asyncllm": side,
        "handler_stats_off": {**side, "throughput_tok_s": 1010.0},
        "handler_aa": {**side, "throughput_tok_s": 990.0, "itl_mean_ms": 2.02},
        "throughput_ratio": 1.0,
        "itl_mean_ratio": 1.0,
        "stats_throughput_ratio": 1000 / 1010,
        "stats_itl_ratio": 1.0,
        "aa_throughput_ratio": 1000 / 990,
        "aa_itl_ratio": 2.0 / 2.02,
    }
    overhead = {"rows": [row], "stats_off_baseline": True, "aa_baseline": True, "stream_interval": 1}
    overhead.update(num_requests=16, max_tokens=32, repeats=3)
    text = render_markdown({"command": "python -m worker bench", "machine": "test", "overhead": overhead})
    assert "| 8 | 1,000.0 | 1,010.0 | 0.990 |" in text  # stats on vs off
    assert "| 8 | 1,000.0 | 990.0 | 1.010 | 2.00 / 2.02 | 0.990 |" in text  # the A/A pair
