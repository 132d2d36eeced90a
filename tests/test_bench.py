"""The benchmark harness at tiny sizes: complete, sane results (not speed thresholds)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TINY_MODEL_ENV, boot_engine
from worker.schema import parse_request
from worker.tiny_models import TinyModels
from worker.tools.bench.coldstart import boot_phases, parse_boot_log
from worker.tools.bench.report import phase_table, render_markdown, render_saved
from worker.tools.bench.servers import boot_order, engine_counters, pod_table
from worker.tools.bench.shapes import llama3_config, llama3_tensor_shapes, write_random_weights
from worker.tools.bench.tables import pod_section
from worker.tools.bench.timing import RequestTiming, summarize
from worker.tools.fit import PRESETS
from worker.tools.sizing import ModelShape

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


# The lines that end each boot phase, as vLLM 0.32 on the H200 and the worker print them (shortened),
# stamped by the cold-start bench; the CUDA-graph lines come twice (memory estimate, then capture).
COMPILED_BOOT = """\
[   0.700] INFO worker.runtime: booting engine for model /tmp/llama8b-real
[  20.500] INFO worker.runtime: vLLM imported in 19.80 s
[  27.900] INFO worker.boot.launch: engine config built in 7.40 s; starting the engine core
[  28.784] (EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...
[  39.258] (EngineCore pid=1) INFO [model_runner.py:424] Model loading took 14.96 GiB memory and 6.69 seconds
[  46.343] (EngineCore pid=1) INFO [monitor.py:62] [backbone] torch.compile took 6.51 s in total
[  50.067] Capturing CUDA graphs (PIECEWISE):   0%|          | 0/51
[  56.459] (EngineCore pid=1) INFO [model_runner.py:1127] Graph capturing finished in 7 secs, took 0.48 GiB
[  57.105] (EngineCore pid=1) INFO [gpu_worker.py:759] Available KV cache memory: 109.49 GiB
[  91.356] Capturing CUDA graphs (PIECEWISE):   0%|          | 0/51
[ 100.196] (EngineCore pid=1) INFO [model_runner.py:1127] Graph capturing finished in 10 secs, took 0.31 GiB
[ 100.983] (EngineCore pid=1) INFO [core.py:395] init engine (profile, create kv cache, warmup model) took 61.69 s
[ 101.097] 2026-11-30 10:04:49,999 INFO worker.engine: warm-up request done in 0.06 s
[ 101.577] 2026-11-30 10:04:50,480 INFO worker.runtime: engine ready in 100.8 s
[ 101.594] [ 100.84s] chunk {"text": " w70079"}
[ 101.598] [ 100.84s] chunk {"text": " w3373"}
"""


def test_boot_phases_follow_the_log_in_order() -> None:
    phases = boot_phases(COMPILED_BOOT)
    assert phases["kv_cache_profile"] == 57.105
    # The second capture, not the memory estimate's: those lines count only after the KV-cache line.
    assert phases["kernel_warmup"] == 91.356 and phases["cuda_graph_capture"] == 100.196
    assert phases["first_token"] == 101.594
    assert (phases["vllm_import"], phases["vllm_config"], phases["engine_config"]) == (20.5, 27.9, 28.784)
    eager = "\n".join(
        line for line in COMPILED_BOOT.splitlines() if "Capturing" not in line and "Graph capturing" not in line
    )
    eager = eager.replace("torch.compile took", "nothing compiled")
    assert set(boot_phases(eager)) == set(phases) - {"torch_compile", "kernel_warmup", "cuda_graph_capture"}
    table = phase_table({"compiled": phases, "eager": boot_phases(eager)})
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table if line.startswith("| ")}
    assert rows["kernel warm-up before the capture"] == "| kernel warm-up before the capture | 34.3 | - |"
    # In eager mode the KV-cache phase runs from the weights load (no compile phase before it).
    assert rows["profile run, CUDA-graph memory estimate"].endswith("| 10.8 | 17.8 |")
    assert rows["**process start to first token**"].endswith("| **101.6** | **101.6** |")
    assert rows["engine core process start (its first line)"].endswith("| 0.9 | 0.9 |")
    # A log from before the worker's stamps: the engine core's first line ends the whole main process.
    unstamped = boot_phases(
        "\n".join(
            line for line in COMPILED_BOOT.splitlines() if " built in " not in line and " imported in " not in line
        )
    )
    assert "vllm_import" not in unstamped and unstamped["engine_config"] == 28.784


def test_pod_table_takes_the_runs_both_servers_finished() -> None:
    """A pod bench cut short leaves one server with a run more than the other: the table compares
    only the runs both finished."""

    def run(tok_s: float) -> list[dict[str, float]]:
        return [
            {"concurrency": 1, "throughput_tok_s": tok_s, "ttft_p50_ms": 10.0, "ttft_p99_ms": 20.0, "itl_mean_ms": 5.0}
        ]

    runs = {"pod": [run(100.0), run(110.0)], "vllm_server": [run(100.0)]}
    (row,) = pod_table(runs)
    assert row["pod"]["throughput_tok_s"] == 100.0 and row["throughput_ratio"] == 1.0


def test_pod_rows_keep_each_runs_ratio_and_the_table_shows_their_range() -> None:
    """A median of a few runs hides how far they spread: each row keeps the ratio of every repeat's
    pair of runs, and the markdown shows their range beside the median."""

    def run(tok_s: float) -> list[dict[str, float]]:
        return [
            {"concurrency": 64, "throughput_tok_s": tok_s, "ttft_p50_ms": 10.0, "ttft_p99_ms": 20.0, "itl_mean_ms": 5.0}
        ]

    runs = {"pod": [run(90.0), run(120.0), run(100.0)], "vllm_server": [run(100.0), run(100.0), run(100.0)]}
    (row,) = pod_table(runs)
    assert row["throughput_ratio_runs"] == [0.9, 1.2, 1.0] and row["throughput_ratio"] == 1.0
    pod = {"num_requests": "auto", "max_tokens": 16, "repeats": 3, "rows": [row]}
    (line,) = [x for x in pod_section({"pod": pod}) if x.startswith("| 64 |")]
    assert "| 1.000 (0.90-1.20; 1.033 ± 0.176) |" in line  # from 3 pairs: their mean ± 2 standard errors


def test_a_bench_of_a_configuration_that_cannot_serve_says_why_in_one_line(subprocess_env: dict[str, str]) -> None:
    """``SPECULATION_CONTROL`` without speculation (the bench sets ``SPECULATIVE_METHOD=none``
    unless a ``SPECULATIVE_CONFIG`` is given): the bench stops before it boots anything, with the
    setting's error on one line and no traceback."""
    env = {**subprocess_env, "MODEL_NAME": "tiny:target", "SPECULATION_CONTROL": "static"}
    command = [sys.executable, "-m", "worker", "bench", "--smoke", "--parts", "pod"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: invalid configuration: SPECULATION_CONTROL needs speculative decoding to be configured"
    ]


def test_the_boot_order_is_the_pods_unless_vllms_server_is_named() -> None:
    assert boot_order({}) == ["pod", "vllm_server"]
    assert boot_order({"POD_BENCH_FIRST": "vllm_server"}) == ["vllm_server", "pod"]
    with pytest.raises(ValueError, match="POD_BENCH_FIRST='vllm': give pod or vllm_server"):
        boot_order({"POD_BENCH_FIRST": "vllm"})


def test_engine_counters_of_several_processes_page(tmp_path: Path) -> None:
    """The page both servers serve with several API processes: prometheus_client's multiprocess
    collector over each process's files (vLLM's engine counters written by two API processes)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    writer = (
        "from prometheus_client import Counter; import sys; "
        "Counter('vllm:generation_tokens', '', ['engine']).labels('0').inc(float(sys.argv[1]))"
    )
    for tokens in ("40", "24"):  # each in a process of its own, as an API process writes them
        env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-c", writer, tokens], env=env, check=True, timeout=60)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    assert engine_counters(generate_latest(registry).decode()) == {"vllm:generation_tokens": 64.0}


def test_engine_counters_are_summed_over_their_labels() -> None:
    """The pod stage's engine counters, read from a Prometheus page as vLLM's registry writes it (a
    sample per engine and model); a counter the page lacks is left out, and gauges are not counted."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    registry = CollectorRegistry()
    preemptions = Counter("vllm:num_preemptions", "", ["engine", "model_name"], registry=registry)
    preemptions.labels("0", "m").inc(2)
    preemptions.labels("1", "m").inc(3)
    Counter("vllm:generation_tokens", "", ["engine"], registry=registry).labels("0").inc(64)
    Gauge("vllm:num_requests_running", "", registry=registry).set(4)
    page = generate_latest(registry).decode()
    assert engine_counters(page) == {"vllm:num_preemptions": 5.0, "vllm:generation_tokens": 64.0}


def test_pooled_pod_runs_take_each_levels_runs_from_every_file(tmp_path: Path) -> None:
    """Pod runs files pooled (``--render --pool``): a level's medians come from every run that
    measured it, in files that cover different levels, and a run only one server finished is left out."""

    def point(concurrency: int, tok_s: float, ttft: float) -> dict[str, float]:
        return {
            "concurrency": concurrency,
            "requests": 8,
            "tokens": 2048,
            "throughput_tok_s": tok_s,
            "ttft_p50_ms": ttft,
            "ttft_p99_ms": ttft,
            "itl_mean_ms": 5.0,
        }

    both = {  # levels 1 and 256, the pod's third run cut short before vLLM's server ran it
        "pod": [[point(1, 100.0, 10.0), point(256, 1000.0, 300.0)]] * 2 + [[point(1, 1.0, 99.0)]],
        "vllm_server": [[point(1, 100.0, 10.0), point(256, 1000.0, 200.0)]] * 2,
    }
    only_256 = {"pod": [[point(256, 2000.0, 100.0)]], "vllm_server": [[point(256, 1000.0, 200.0)]]}
    files = []
    for name, runs in (("a-runs.json", both), ("b-runs.json", only_256)):
        (tmp_path / name).write_text(json.dumps(runs))
        files.append(tmp_path / name)
    text = render_saved(files, pool=True)
    assert text.count("####") == 1 and "median of 2-3 runs per server" in text
    lines = [line.split(" | ") for line in text.splitlines() if line[:3] in ("| 1", "| 2")]
    rows = {cells[0].lstrip("| "): cells for cells in lines}
    assert rows["1"][1:4] == ["100.0", "100.0", "1.000 (1.00-1.00)"]  # the cut-short run is not in it
    # medians of 1000, 1000, 2000; the ratio run by run 1, 1 and 2
    assert rows["256"][1:5] == ["1,000.0", "1,000.0", "1.000 (1.00-2.00; 1.333 ± 0.667)", "300.0 / 200.0"]
    assert "median of 2 runs per server" in render_saved(files[:1])  # unpooled, one file as before


def test_render_saved_gpu_results(tmp_path: Path) -> None:
    """Saved results render to tables whose cells are the JSON's own figures (read here, not copied)."""
    results = ROOT / "docs" / "gpu-results"
    ceiling_path = results / "pod" / "v034-h100-1206j" / "ceiling.json"  # overhead and roofline, 256 and 512
    pod_path = results / "pod" / "v034-h100-1206j" / "pod-vs-server.json"
    ceiling = json.loads(ceiling_path.read_text())
    # The same results with an engine that sent an output per 8 tokens, under another name.
    si8 = {**ceiling, "overhead": {**ceiling["overhead"], "stream_interval": 8}}
    (tmp_path / "si8.json").write_text(json.dumps(si8))
    text = render_saved([ceiling_path, tmp_path / "si8.json", pod_path])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    by_c = {r["concurrency"]: r for r in ceiling["overhead"]["rows"]}
    ratios = f"- / {by_c[256]['throughput_ratio']:.3f}"  # no run at one stream
    row = rows["ceiling"]
    assert row.endswith(ratios + " |") and f"{by_c[256]['handler']['throughput_tok_s']:,.0f}" in row
    assert rows["si8 (stream interval 8)"].endswith(ratios + " |")
    assert "Engine stream interval: 8 token(s) per output" in text
    pod = json.loads(pod_path.read_text())
    assert f"#### {pod['label']} (`pod-vs-server.json`)" in text
    pod_row = pod["pod"]["rows"][-1]
    assert f"| {pod_row['concurrency']} | {pod_row['pod']['throughput_tok_s']:,.1f} |" in text


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _bench(out: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "worker", "bench", "--smoke", *args, "--out", str(out)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "bench.json").read_text())
    assert results["engine_boots"] <= 3  # a smoke run shares engines where configurations agree
    return results


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_run_of_the_in_process_parts(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """Overhead, first request, speculation, the stats path and the roofline on three engines: one
    without speculation (shared by the first three parts' baselines) and one per draft. The spec
    part feeds each point's requests to the worker's acceptance watchdog (its default settings):
    the unrelated tiny draft (acceptance ~0) trips it, the target as its own draft does not."""
    out = tmp_path / "bench"
    parts = "overhead,first_request,spec,stats_path,roofline"
    results = _bench(
        out,
        {**subprocess_env, **TINY_MODEL_ENV},
        "--parts",
        parts,
        "--drafts",
        "tiny:target,tiny:unrelated",
        "--spec-rounds",
        "2",
        "--spec-requests",
        "4",
    )
    assert results["engine_boots"] == 3
    rows = results["overhead"]["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert _positive(row["throughput_ratio"]) and _positive(row["ttft_p50_ratio"])
        for side in [k for k in row if isinstance(row[k], dict)]:
            assert row[side]["tokens"] == 4 * 16  # ignore_eos: every request ran to max_tokens
    first = results["first_request"]
    assert _positive(first["first_ttft_ms"]) and len(first["after_ttfts_ms"]) == 5 and first["warmup_request"]
    assert first["ratio"] == pytest.approx(first["first_ttft_ms"] / first["steady_ttft_ms"])
    assert _positive(first["first_featured_ttft_ms"]) and _positive(first["featured_ratio"])
    spec = results["spec"]
    by_draft = {r["draft"]: r for r in spec["rows"]}
    assert by_draft["tiny:target"]["mean_acceptance_length"] > 2 and by_draft["tiny:target"]["watchdog_low"] is False
    assert by_draft["tiny:unrelated"]["mean_acceptance_length"] < 1.5 and by_draft["tiny:unrelated"]["watchdog_low"]
    for row in [spec["baseline"], *by_draft.values()]:  # two rounds of the requests, the median of their speeds
        assert len(row["round_tok_s"]) == 2 and row["decode_tok_s"] == pytest.approx(sum(row["round_tok_s"]) / 2)
        assert row["ms_per_token"] == pytest.approx(1000 / row["decode_tok_s"])
    for row in by_draft.values():
        assert row["k"] == 2 and row["num_accepted_draft_tokens"] <= row["num_draft_tokens"]
        assert row["mean_acceptance_length"] == pytest.approx(
            1 + row["num_accepted_draft_tokens"] / row["num_spec_steps"]
        )
        # vLLM's engine-wide counters agree with the per-request sums over the measured requests.
        assert row["engine_counters"] == {
            "num_drafts": row["num_spec_steps"],
            "num_draft_tokens": row["num_draft_tokens"],
            "num_accepted_tokens": row["num_accepted_draft_tokens"],
        }
    assert by_draft["tiny:target"]["watchdog_requests"] == 2 * 4 + 1
    assert _positive(results["roofline"]["weight_bytes_per_step"])
    # The stats path's own cost per step (the transport a difference of timings: at smoke sizes it
    # may be noise; vLLM's tracking and the hook timed alone).
    assert [r["batch"] for r in results["stats_path"]["rows"]] == [1, 2]
    assert all(_positive(r["all_stop"]["observe_us"]) for r in results["stats_path"]["rows"])
    assert all(_positive(r[case]["hook_us"]) for r in results["stats_path"]["rows"] for case in r if case != "batch")
    # Requests end only where their text has the stop string, and each end's abort is answered.
    assert all(r["all_stop"]["ends_per_step"] == 0 for r in results["stats_path"]["rows"])
    ending = [r["all_stop_ending"] for r in results["stats_path"]["rows"]]
    assert all(c["ends_per_step"] > 0 and _positive(c["ends_us"]) for c in ending)
    markdown = (out / "bench.md").read_text()
    assert "Handler overhead" in markdown and "python -m worker bench --smoke" in markdown
    assert "Cost of the exact-stats path per engine step" in markdown
    assert "**fired**" in markdown and "median of 2 rounds" in markdown
    assert (out / "throughput.png").stat().st_size > 0 and (out / "speculative.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_run_of_the_server_parts(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """The pod against vLLM's own server (two processes), and the handler's cold start phase by phase."""
    out = tmp_path / "bench"
    results = _bench(out, {**subprocess_env, **TINY_MODEL_ENV}, "--parts", "pod,coldstart")
    for row in results["pod"]["rows"]:
        assert _positive(row["throughput_ratio"]) and _positive(row["ttft_p50_ratio"])
        assert row["pod"]["tokens"] == row["vllm_server"]["tokens"] == 4 * 16
        # The CPU time of each server's API process, per token.
        assert _positive(row["pod"]["api_cpu_ms_per_token"]) and _positive(row["vllm_server"]["api_cpu_ms_per_token"])
        # Each server's engine counters over the level, scraped from its /metrics: the tokens it made.
        for name in ("pod", "vllm_server"):
            assert row[name]["engine"]["vllm:generation_tokens"] == row[name]["tokens"], name
    assert results["pod"]["boot_order"] == ["pod", "vllm_server"]
    assert [r["concurrency"] for r in results["pod"]["rows"]] == [1, 2]
    cold = results["coldstart"]
    assert _positive(cold["handler"]["first_token_s"]) and "vllm_server" not in cold
    # The handler's boot, phase by phase, from its stamped log (vLLM's INFO lines: --verbose).
    phases = cold["handler"]["phases_end_s"]
    assert phases["engine_config"] < phases["engine_ready"] < phases["first_token"] == cold["handler"]["first_token_s"]
    # The worker's own stamps split the main process: vLLM's imports, then the engine config.
    assert phases["vllm_import"] < phases["vllm_config"] < phases["engine_config"]
    assert 0.0 <= cold["handler"]["weights_resident_at_start"] <= 1.0
    assert 0 < cold["handler_import_s"] < 60  # a generous bound: past it the import hung
    assert "python -m worker bench --smoke" in (out / "bench.md").read_text()


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


@pytest.mark.parametrize("shape", ["llama-3-8b", "llama-3.2-1b", "llama-3-70b"])
def test_checkpoint_shapes_hold_the_planners_parameter_count(shape: str) -> None:
    """The random-weight checkpoints measure loading at real size: their tensors add up to the
    parameters the fit planner counts for the same shape."""
    numel = sum(math.prod(dims) for dims in llama3_tensor_shapes(llama3_config(shape)).values())
    assert numel == ModelShape.from_config(PRESETS[shape]).num_params


@pytest.mark.slow
async def test_random_weights_load_in_vllm_under_their_own_names(tiny_models: TinyModels, tmp_path: Path) -> None:
    """``write_random_weights`` writes what vLLM's default loader reads: every tensor of a Llama
    under Hugging Face's names, in shards with an index (a missing or misnamed tensor fails the
    load). Shown on the tiny model's shape, with its tokenizer."""
    model = tmp_path / "model"
    shutil.copytree(tiny_models.path("target"), model, ignore=shutil.ignore_patterns("*.safetensors"))
    written = write_random_weights(model, shard_bytes=2**19)
    index = json.loads((model / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and index["metadata"]["total_size"] == written
    engine = await boot_engine(
        tiny_models,
        MODEL_NAME=model,
        LOAD_FORMAT="auto",
        ENFORCE_EAGER="true",
        MAX_MODEL_LEN=256,
        KV_CACHE_MEMORY_BYTES=64 * 2**20,
        WARMUP_REQUEST="false",
    )
    try:
        request = parse_request({"prompt": "Once upon", "sampling_params": {"max_tokens": 4, "ignore_eos": True}})
        chunks = [chunk async for chunk in engine.generate(request)]
    finally:
        engine.shutdown()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


@pytest.mark.slow
def test_stats_off_baseline_keeps_the_exactness_check_on_the_measured_engine(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """With a second engine in the process (the stats-off baseline), the per-request sums are still
    checked against the measured engine's own counters: vLLM keeps only the last booted engine's
    Prometheus metrics, so the measured engine boots last. The report is written as the run goes
    and ends unmarked once complete."""
    out = tmp_path / "overhead"
    command = [sys.executable, "-m", "worker", "bench", "--parts", "overhead", "--concurrency", "1"]
    command += [
        "--repeats",
        "1",
        "--num-requests",
        "2",
        "--max-tokens",
        "16",
        "--stats-off-baseline",
        "--out",
        str(out),
    ]
    env = {
        **subprocess_env,
        **TINY_MODEL_ENV,
        "SPECULATIVE_METHOD": "draft_model",
        "SPECULATIVE_MODEL": "tiny:noisy",
        "NUM_SPECULATIVE_TOKENS": "2",
    }
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    overhead = json.loads((out / "bench.json").read_text())["overhead"]
    assert overhead["partial"] is False and [r["concurrency"] for r in overhead["rows"]] == [1]
    assert overhead["rows"][0]["handler_stats_off"]["tokens"] == 2 * 16
    exact = overhead["spec_exact"]
    assert exact["with_spec_decode"] == exact["requests"] and exact["per_request_sum"]["num_draft_tokens"] > 0
    assert exact["equal"], exact
    # With a stop string: the per-request counts plus the steps taken off past each stop string.
    stopped = exact["with_stop"]
    assert stopped["equal"] and stopped["partial"] == 0 and stopped["with_spec_decode"] == stopped["requests"], stopped


def test_a_partial_overhead_run_says_so() -> None:
    side = {"throughput_tok_s": 1000.0, "ttft_p50_ms": 5.0, "itl_mean_ms": 2.0}
    row = {"concurrency": 1, "handler": side, "vllm_asyncllm": side, "throughput_ratio": 1.0, "itl_mean_ratio": 1.0}
    overhead = {"rows": [row], "num_requests": 8, "max_tokens": 32, "repeats": 3, "partial": True}
    text = render_markdown({"command": "python -m worker bench", "machine": "test", "overhead": overhead})
    assert "**Partial**: the run ended after 1 concurrency level(s)." in text
    assert "Partial" not in render_markdown(
        {**{"command": "c", "machine": "m"}, "overhead": {**overhead, "partial": False}}
    )


def test_vllms_server_beside_the_handler_keeps_its_own_cuda_graph_defaults() -> None:
    from worker.config import load_settings
    from worker.tools.bench.servers import vllm_server_args

    def flags(**env: str) -> list[str]:
        return vllm_server_args(load_settings({"MODEL_NAME": "org/m", **env}), model_path="/m", port=1)

    assert "--compilation-config" not in flags(MAX_CONCURRENCY="8")  # the serverless defaults are the worker's
    chosen = flags(CUDAGRAPH_MODE="FULL_AND_PIECEWISE")  # a mode set by hand: both get it
    assert json.loads(chosen[chosen.index("--compilation-config") + 1]) == {"cudagraph_mode": "FULL_AND_PIECEWISE"}


def test_vllms_server_beside_the_worker_speculates_as_the_worker_does() -> None:
    from worker.config import load_settings
    from worker.tools.bench.servers import vllm_server_args

    spec = {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}
    env = {"MODEL_NAME": "org/m", "SPECULATIVE_CONFIG": json.dumps(spec), "SPECULATION_CONTROL": "static"}
    args = vllm_server_args(load_settings(env), model_path="/m", port=1)
    assert json.loads(args[args.index("--speculative-config") + 1]) == spec
    assert not any("per-request-spec" in arg for arg in args)  # the worker's own flag, not vLLM's server's
    plain = vllm_server_args(load_settings({"MODEL_NAME": "org/m"}), model_path="/m", port=1)
    assert "--speculative-config" not in plain
    # Under auto (a draft model's default) the worker's graph list is not a k by batch size for vLLM: static k.
    auto = vllm_server_args(load_settings({**env, "SPECULATION_CONTROL": "auto"}), model_path="/m", port=1)
    assert json.loads(auto[auto.index("--speculative-config") + 1]) == spec
    # A user's schedule is vLLM's own, and kept.
    ceiling = {**env, "SPECULATION_CONTROL": "auto", "SPECULATIVE_TOKENS_BY_BATCH": "1-4:3,5-256:1"}
    args = vllm_server_args(load_settings(ceiling), model_path="/m", port=1)
    assert json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens_per_batch_size"] == [
        [1, 4, 3],
        [5, 256, 1],
    ]


def test_the_bench_runs_the_serving_path_without_speculation_unless_the_environment_sets_it() -> None:
    from worker.config import load_settings
    from worker.tools.bench.cli import bench_env
    from worker.tools.bench.spec_map_config import config_env

    plain = bench_env({}, max_concurrency=8)
    assert plain == {"SPECULATIVE_METHOD": "none", "MODEL_NAME": "tiny:target", "MAX_NUM_SEQS": "8"}
    assert bench_env({"SPECULATIVE_METHOD": "ngram"}, max_concurrency=8)["SPECULATIVE_METHOD"] == "ngram"
    # A speculative config (the pod-spec stage's) loads as it is: before, its SPECULATIVE_METHOD=none refused it.
    configured = bench_env(
        {"SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 2}'}, max_concurrency=8
    )
    assert load_settings(configured).resolved_speculative_config == {"method": "ngram", "num_speculative_tokens": 2}
    # The spec and lossless parts' baseline drops whatever speculation it was given.
    assert (
        load_settings(config_env({**configured, "SPECULATION_CONTROL": "static"}, "none")).resolved_speculative_config
        is None
    )


def test_vllms_server_beside_the_worker_loads_the_drafter_the_worker_resolves(tiny_models: TinyModels) -> None:
    """The tiny draft by its name, as the worker's boot resolves it (built offline): a path vLLM loads."""
    from worker.config import load_settings
    from worker.tools.bench.servers import vllm_server_args

    env = {"MODEL_NAME": "org/m", "SPECULATIVE_MODEL": "tiny:noisy", "NUM_SPECULATIVE_TOKENS": "2"}
    args = vllm_server_args(load_settings(env), model_path="/m", port=1)
    assert json.loads(args[args.index("--speculative-config") + 1])["model"] == str(tiny_models.path("noisy"))


def test_a_lossy_row_on_the_cpu_build_says_why() -> None:
    from worker.tools.bench.tables_boot import LOSSY_ON_CPU, lossless_section

    row = {"config": "draft", "tv_per_position": [0.5], "positions_over_threshold": [0], "low_logprob_share": 0.4}
    block = {
        "sampling": {"temperature": 1.0},
        "num_samples": 10,
        "num_positions": 1,
        "prompt": "Once",
        "bootstrap": {"quantile": 0.999, "draws": 400},
        "thresholds": [0.1],
        "control": {
            "tv_per_position": [0.05],
            "positions_over_threshold": [],
            "low_logprob_share": 0.0,
            "passes": True,
        },
        "rows": [{**row, "lossless": False}],
    }
    assert LOSSY_ON_CPU in lossless_section({"lossless": [block]})
    assert LOSSY_ON_CPU not in lossless_section({"lossless": [block], "gpu": "NVIDIA H200"})
    assert LOSSY_ON_CPU not in lossless_section({"lossless": [{**block, "rows": [{**row, "lossless": True}]}]})
