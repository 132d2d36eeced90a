"""The speculation map's bench part (worker/tools/bench/spec_map.py, spec_map_config.py, spec_map_report.py):
its configurations, waves and report."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from tests.helpers import CACHE_DIR
from worker.config import load_settings
from worker.tiny_models import TinyModels
from worker.tools.bench import spec_map
from worker.tools.bench.acceptance_mix import mix_class
from worker.tools.bench.shapes import llama3_config
from worker.tools.bench.spec_map import (
    MIX_REQUESTS_PER_STREAM,
    bench_spec_map,
    controller_step_us,
    median_point,
    request_tokens,
    run_wave,
    steady_window,
)
from worker.tools.bench.spec_map_config import baseline, check_mix, config_env
from worker.tools.bench.spec_map_report import render, render_pooled
from worker.tools.bench.timing import RequestTiming


def test_a_configuration_names_drafter_k_synthetic_length_and_control() -> None:
    base = {"MODEL_NAME": "m", "SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "2"}
    assert config_env(base, "none")["SPECULATIVE_METHOD"] == "none"
    env = config_env(base, "/models/d-1b:4:2.5:auto")
    spec = json.loads(env["SPECULATIVE_CONFIG"])
    assert spec == {
        "num_speculative_tokens": 4,
        "method": "draft_model",
        "model": "/models/d-1b",
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.5,
    }
    settings = load_settings(env)  # the base's knobs are dropped: no SPECULATIVE_CONFIG conflict
    assert settings.speculation_control == "auto"
    ngram = json.loads(config_env(base, "ngram:6:real:static")["SPECULATIVE_CONFIG"])
    assert ngram["method"] == "ngram" and "rejection_sample_method" not in ngram
    stock = config_env(base, "ngram:4:2.5:stock+TORCH_COMPILE=on")
    assert stock["PER_REQUEST_SPEC_DECODE_METRICS"] == "none" and stock["TORCH_COMPILE"] == "on"
    assert load_settings(stock).per_request_spec_decode_metrics == "none"
    with pytest.raises(ValueError, match=r"\+KEY=VALUE"):
        config_env(base, "none+TORCH_COMPILE")
    with pytest.raises(ValueError, match="DRAFTER:K:LENGTH:CONTROL"):
        config_env(base, "ngram:4:2.5:dynamic")
    with pytest.raises(ValueError, match="DRAFTER:K:LENGTH:CONTROL"):
        config_env(base, "ngram:four:2.5:auto")


def test_an_eagle3_head_runs_as_vllms_eagle3_and_a_schedule_rides_along(tmp_path: Path) -> None:
    head = tmp_path / "head"
    head.mkdir()
    config = llama3_config("eagle3-llama-3-8b")
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 32000
    (head / "config.json").write_text(json.dumps(config))
    spec = json.loads(config_env({}, f"{head}:4:2.5:static")["SPECULATIVE_CONFIG"])
    assert spec["method"] == "eagle3" and spec["model"] == str(head)
    # A plain Llama checkpoint is a draft model; so is a name with no config here.
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text(json.dumps(llama3_config("llama-3.2-1b")))
    assert json.loads(config_env({}, f"{tmp_path}/draft:4:2.5:static")["SPECULATIVE_CONFIG"])["method"] == "draft_model"
    assert json.loads(config_env({}, "tiny:noisy:4:2.5:static")["SPECULATIVE_CONFIG"])["method"] == "draft_model"
    env = config_env({}, "ngram:4:2.5:auto+TORCH_COMPILE=on+SPECULATIVE_TOKENS_BY_BATCH=1-1:4,2-2:2")
    assert load_settings({"MODEL_NAME": "m", **env}).speculative_tokens_by_batch == [(1, 1, 4), (2, 2, 2)]


def test_the_report_reads_the_saved_map() -> None:
    row = {"runs": 1, "throughput_tok_s": 200.0, "itl_p50_ms": 5.0, "mean_acceptance_length": None}
    spec_row = {**row, "throughput_tok_s": 300.0, "mean_acceptance_length": 2.5, "mean_k_verified": 2.0}
    result = {
        "configs": ["none", "d:4:2.5:auto"],
        "concurrencies": [1],
        "table": {
            "none": {"1": {**row, "vs_none": 1.0}},
            "d:4:2.5:auto": {"1": {**spec_row, "num_steps_off": 3, "vs_none": 1.5}},
        },
    }
    text = render(result)
    assert "| `d:4:2.5:auto` | 300 (1.50x) |" in text
    assert "| `d:4:2.5:auto` | 2.50 / 2.00 / 3 |" in text


def test_pooled_maps_compare_each_configuration_with_its_own_runs_baseline(tmp_path: Path) -> None:
    """Two runs whose baselines differ: each ratio is against its own run's, never the other's."""

    def one(base: float, name: str, tok: float) -> dict[str, Any]:
        row = {"runs": 1, "itl_p50_ms": 5.0, "mean_acceptance_length": None}
        return {
            "configs": ["none+TORCH_COMPILE=on", name],
            "concurrencies": [1, 8],
            "table": {
                "none+TORCH_COMPILE=on": {"1": {**row, "throughput_tok_s": base}, "8": None},
                name: {"1": {**row, "throughput_tok_s": tok}, "8": None},
            },
        }

    run_b = one(100.0, "ngram_gpu:1:2.0:static", 190.0)
    run_b["table"]["ngram_gpu:1:2.0:static"]["8"] = {"runs": 1, "throughput_tok_s": 900.0}  # no baseline there
    run_c = one(100.0, "ngram:4:1.5:auto", 150.0)
    run_c["table"]["ngram:4:1.5:auto"]["1"]["vs_none"] = 1.25  # a saved map's own ratio stands
    run_a = one(200.0, "ngram:4:3.5:auto", 700.0)
    run_a["table"]["none+TORCH_COMPILE=on"]["8"] = {"runs": 1, "throughput_tok_s": 1600.0}
    run_a["table"]["ngram:4:3.5:auto"]["8"] = {"runs": 1, "throughput_tok_s": 4800.0}
    maps = [("run-a", run_a), ("run-b", run_b), ("run-c", run_c)]
    text = render_pooled(maps, plot=tmp_path / "pooled.png")
    assert "| `ngram:4:3.5:auto` (run-a) | 3.50x | 3.00x |" in text
    assert "| `ngram_gpu:1:2.0:static` (run-b) | 1.90x | - |" in text  # no baseline at 8 in its own run
    assert "| `ngram:4:1.5:auto` (run-c) | 1.25x | - |" in text
    assert "none+TORCH_COMPILE=on" not in text  # the baselines are what the rows are against
    assert (tmp_path / "pooled.png").stat().st_size > 0
    alone = {**one(1.0, "ngram:4:3.5:auto", 1.0), "configs": ["ngram:4:3.5:auto"]}
    with pytest.raises(ValueError, match="run-d: no configuration without speculation"):
        render_pooled([("run-d", alone)])
    with pytest.raises(ValueError, match="no configuration with speculation"):
        render_pooled([("run-e", {**one(1.0, "x", 1.0), "configs": ["none+TORCH_COMPILE=on"]})])


def test_a_map_without_no_speculation_plots_throughput(tmp_path: Path) -> None:
    """A map of speculative configurations alone (two ways to run the same k) has no ``vs_none``."""
    row = {"runs": 1, "throughput_tok_s": 9000.0, "itl_p50_ms": 2.5, "mean_acceptance_length": 2.5}
    result = {
        "configs": ["ngram:4:2.5:auto", "ngram:4:2.5:auto+SPECULATIVE_TOKENS_BY_BATCH=1-256:2"],
        "concurrencies": [32, 64],
        "table": {
            "ngram:4:2.5:auto": {"32": {**row, "mean_k_verified": 2.0, "num_steps_off": 0}, "64": None},
            "ngram:4:2.5:auto+SPECULATIVE_TOKENS_BY_BATCH=1-256:2": {
                "32": {**row, "throughput_tok_s": 9500.0, "mean_k_verified": 2.0, "num_steps_off": 0}
            },
        },
    }
    text = render(result, plot=tmp_path / "map.png")
    assert "| `ngram:4:2.5:auto` | 9,000 | - |" in text
    assert (tmp_path / "map.png").stat().st_size > 0


def test_a_maps_lines_run_from_the_fewest_streams_up_whatever_order_it_ran_them(tmp_path: Path) -> None:
    """Maps run their loads in any order (``MAP_CONCURRENCY=128,1,8``); a line drawn in that order
    on a log axis would double back."""
    from matplotlib.axes import Axes

    row = {"runs": 1, "itl_p50_ms": 5.0, "mean_acceptance_length": None}
    result = {
        "configs": ["none", "ngram:4:3.5:auto"],
        "concurrencies": [128, 1, 8],
        "table": {
            name: {str(c): {**row, "throughput_tok_s": tok * c} for c in (128, 1, 8)}
            for name, tok in (("none", 100.0), ("ngram:4:3.5:auto", 300.0))
        },
    }
    drawn: list[list[int]] = []
    plot = Axes.plot

    def record(self: Axes, xs: list[int], *args: Any, **kwargs: Any) -> Any:
        drawn.append(list(xs))
        return plot(self, xs, *args, **kwargs)

    with mock.patch.object(Axes, "plot", record):
        render(result, plot=tmp_path / "map.png")
        render_pooled([("run", result)], plot=tmp_path / "pooled.png")
    assert drawn == [[1, 8, 128]] * 3  # the map's two lines, the pooled map's one


def test_the_acceptance_mix_refuses_what_its_hook_cannot_reach() -> None:
    base = {"MODEL_NAME": "m"}
    # Every GPU engine runs V2, whose sampler the hook reaches: a draft model's too.
    check_mix(base, ["none", "ngram:4:5.0:auto", "ngram_gpu:2:3.0:static+TORCH_COMPILE=on", "/models/d:4:5.0:static"])
    refused = {
        "ngram_gpu:4:2.5:static+TORCH_COMPILE=on": "LENGTH = K \\+ 1 = 5",
        "ngram:4:real:auto": "LENGTH = K \\+ 1 = 5",
        "ngram:4:5.0:auto+VLLM_WORKER_MULTIPROC_METHOD=spawn": "spawned engine core",
    }
    for name, reason in refused.items():
        with pytest.raises(ValueError, match=reason):
            check_mix(base, ["none", name])


class FakeEngine:
    """Stands in for the worker's engine in a wave (what a GPU run with the mix would report): each
    request drafts 2 tokens a step and accepts 2, 1 or 0 of them by the class its request id
    carries, so its 12 tokens take 4, 6 or 12 steps, one chunk a step. The steps are the ticks of a
    virtual clock (``now``; :meth:`clock` runs it) that the test gives the bench as its
    ``time.perf_counter``, so that every request in flight decodes in lockstep, as in an engine."""

    served = SimpleNamespace(speculative_method="ngram")
    STEPS = (4, 6, 12)  # by class

    def __init__(self) -> None:
        self.now = 0.0
        self._tick = asyncio.Event()

    async def clock(self) -> None:
        while True:
            for _ in range(50):  # every request woken by the last tick reaches its next wait
                await asyncio.sleep(0)
            self.now += 1.0
            tick, self._tick = self._tick, asyncio.Event()
            tick.set()

    async def generate(self, request: Any, *, request_id: str | None = None) -> Any:
        assert request_id is not None
        accepted = [2, 1, 0][mix_class(request_id) or 0]
        steps = self.STEPS[mix_class(request_id) or 0]
        for step in range(steps):
            await self._tick.wait()
            final = step == steps - 1
            stats = SimpleNamespace(
                num_spec_steps=steps, num_draft_tokens=2 * steps, num_accepted_draft_tokens=accepted * steps
            )
            yield SimpleNamespace(
                num_tokens=1 + accepted,
                is_final=final,
                usage=SimpleNamespace(completion_tokens=12) if final else None,
                spec_decode=stats if final else None,
            )


async def fake_wave(monkeypatch: pytest.MonkeyPatch, *, concurrency: int) -> dict[str, Any]:
    engine = FakeEngine()
    monkeypatch.setattr(time, "perf_counter", lambda: engine.now)
    clock = asyncio.create_task(engine.clock())
    try:
        return await run_wave(engine, concurrency=concurrency, max_tokens=12, mix=[1.0, 0.5, 0.0])
    finally:
        clock.cancel()


def test_the_steady_window_runs_while_every_stream_is_busy() -> None:
    # Two streams, six requests: the first two start together; request 2 is admitted at 5 (when
    # request 0 ends), request 3 at 6, ..., request 5 at 12.
    runs = [(0, 5), (0, 6), (5, 9), (6, 12), (9, 14), (12, 16)]
    timings = [RequestTiming(start=float(a), end=float(b)) for a, b in runs]
    # From the first two requests' last end to the first end after the last start.
    assert steady_window(timings, concurrency=2) == (6.0, 14.0)
    assert steady_window([RequestTiming(start=0.0, end=4.0)], concurrency=1) is None  # no refill
    assert steady_window([RequestTiming(start=0.0)], concurrency=1) is None


async def test_a_wave_reports_the_acceptance_of_each_class(monkeypatch: pytest.MonkeyPatch) -> None:
    point = await fake_wave(monkeypatch, concurrency=6)
    assert point["requests"] == 6 * MIX_REQUESTS_PER_STREAM
    assert point["acceptance_by_class"] == [3.0, 2.0, 1.0]
    assert point["mean_acceptance_length"] == pytest.approx(1 + (2 * 4 + 6) / (4 + 6 + 12))
    assert point["ms_per_step"] is None  # the batch's requests do not decode in lockstep
    table = median_point([point, {**point, "acceptance_by_class": [2.0, 2.0, None]}])
    assert table["acceptance_by_class"] == [2.5, 2.0, 1.0]
    none = {"runs": 1, "throughput_tok_s": 100.0, "itl_p50_ms": 5.0, "mean_acceptance_length": None}
    configs = ["none+TORCH_COMPILE=on", "ngram:2:3.0:auto"]
    result = {"configs": configs, "concurrencies": [6], "mix": [1.0, 0.5, 0.0]}
    result["table"] = {configs[0]: {"6": {**none, "vs_none": 1.0}}, "ngram:2:3.0:auto": {"6": table}}
    text = render(result)
    assert "Acceptance length by class (rates 1, 0.5, 0;" in text
    assert "| `ngram:2:3.0:auto` | 2.50 / 2.00 / 1.00 |" in text
    assert "Throughput, tok/s (vs no speculation)" in text and "Engine step" not in text
    assert baseline(configs) == configs[0] and baseline(["none", *configs]) == "none" and baseline(configs[1:]) is None
    result["runs"] = {configs[1]: {"6": [{"throughput_tok_s": 1.0}]}}  # a map from before the window
    assert "of whole waves of one request per stream" in render(result)


async def test_a_mixed_waves_throughput_is_its_steady_state_not_its_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wave's tokens per step in its window, against the same closed loop worked out step by
    step here: the first requests end, then each stream's next request starts as one ends, the
    classes by request index, their chunks one a step (3, 2 or 1 tokens)."""
    concurrency = 3
    point = await fake_wave(monkeypatch, concurrency=concurrency)
    free = [0] * concurrency
    runs = []  # (start, end, tokens a step)
    for i in range(concurrency * MIX_REQUESTS_PER_STREAM):
        stream = free.index(min(free))
        start, end = free[stream], free[stream] + FakeEngine.STEPS[i % 3]
        runs.append((start, end, 3 - i % 3))
        free[stream] = end
    window_start = max(end for _, end, _ in runs[:concurrency])
    window_end = min(end for _, end, _ in runs if end > max(start for start, _, _ in runs))
    tokens = sum(
        per_step for start, end, per_step in runs for at in range(start + 1, end + 1) if window_start < at <= window_end
    )
    assert point["steady_window_s"] == window_end - window_start
    assert point["throughput_tok_s"] == pytest.approx(tokens / (window_end - window_start))
    # Near the steady rate (12 tokens per 22/3 steps a stream), well above the whole wave's.
    assert point["throughput_tok_s"] == pytest.approx(concurrency * 12 / (22 / 3), rel=0.1)
    assert point["tokens"] / point["wall_s"] < 0.9 * point["throughput_tok_s"]


def test_the_controllers_cost_per_step_is_measured() -> None:
    assert 0 < controller_step_us(8, steps=200) < 10_000


@pytest.mark.parametrize("plain_name", ["none", "none+TORCH_COMPILE=on"])
def test_the_step_cost_is_read_back_off_a_map(plain_name: str) -> None:
    from worker.speculation.cost import StepCost, step_ms
    from worker.tools.bench.spec_map_report import fit_step_cost

    truth = StepCost(5.0, 0.02, 0.03, 512, 0.5, 1.5, 0.005, True)
    plain = StepCost(5.0, 0.02, 0.03, 512, 0.0, 0.0, 0.0, False)
    loads = [1, 8, 32, 64, 128, 256]

    def rows(ms: Any) -> dict[str, Any]:
        return {str(b): {"ms_per_step": ms(b)} for b in loads}

    result = {
        "table": {
            plain_name: rows(lambda b: step_ms(plain, batch_size=b, k=0)),
            "d:4:2.5:static": rows(lambda b: step_ms(truth, batch_size=b, k=4)),
            "d:4:1.0:auto": rows(lambda b: step_ms(truth, batch_size=b, k=0)),
        }
    }
    fitted = fit_step_cost(result, static="d:4:2.5:static", off="d:4:1.0:auto")
    for field in ("base_ms", "per_seq_ms", "per_token_ms", "verify_ms", "draft_pass_ms", "draft_per_seq_ms"):
        assert fitted[field] == pytest.approx(getattr(truth, field), abs=1e-3), field


@pytest.mark.slow
async def test_a_small_map_on_the_cpu_engines(tiny_models: TinyModels, tmp_path: Path) -> None:
    """The harness end to end on CPU engines (the standard sampler: synthetic acceptance is GPU-only):
    no speculation, the noisy draft with the worker's stats, and the same draft with vLLM's own
    scheduler (``stock``: no per-request stats, so its engine steps are not known)."""
    noisy = str(tiny_models.path("noisy"))
    configs = ["none", f"{noisy}:2:real:static", f"{noisy}:2:real:stock"]
    base = {"WORKER_CACHE_DIR": str(CACHE_DIR), "MODEL_NAME": "tiny:target"}
    result = await bench_spec_map(
        base, configs=configs, concurrencies=[2], max_tokens=8, repeats=1, out=tmp_path, deadline_s=None
    )
    assert result["errors"] == {}
    none, static, stock = (result["table"][name]["2"] for name in configs)
    assert none["ms_per_step"] > 0 and none["mean_acceptance_length"] is None
    assert static["ms_per_step"] > 0 and 1 <= static["mean_acceptance_length"] <= 3
    assert stock["throughput_tok_s"] > 0 and stock["ms_per_step"] is None and stock["mean_acceptance_length"] is None
    assert json.loads((tmp_path / "spec_map.json").read_text())["table"] == json.loads(json.dumps(result["table"]))
    assert "| `none` |" in render(result)


def test_a_length_spread_gives_each_request_its_own_length_the_same_in_every_configuration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lengths = [request_tokens(i, 128, 0.5) for i in range(2000)]
    assert lengths == [request_tokens(i, 128, 0.5) for i in range(2000)]  # by index: every engine alike
    assert min(lengths) >= 64 and max(lengths) <= 192 and len(set(lengths)) > 100
    assert sum(lengths) / len(lengths) == pytest.approx(128, rel=0.03)
    assert {request_tokens(i, 128, 0.0) for i in range(50)} == {128}
    with pytest.raises(SystemExit):
        spec_map.main(["--length-spread", "1.5"])
    monkeypatch.delenv("SPEC_MAP_ACCEPTANCE_MIX", raising=False)
    with pytest.raises(SystemExit):  # without a mix: no steady window to measure in
        spec_map.main(["--length-spread", "0.5"])
    assert "--length-spread needs SPEC_MAP_ACCEPTANCE_MIX" in capsys.readouterr().err
