"""The GPU stages as data (their commands at full and smoke sizes, worker/tools/bench/stages.py),
the runner's deadline, clean-up and archive (child processes of its own, in a runner process of
its own: worker/tools/bench/stage_runner.py), and one stage run at smoke sizes on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from worker.config import Settings
from worker.config.environment import review
from worker.tools.bench.cli import ALL_PARTS
from worker.tools.bench.stage_runner import gpu_label, main
from worker.tools.bench.stages import COMMON_ENV, SHAPES_ENV, STAGES, Bench, Checkpoints, SpecMap, command, real_sampler

ROOT = Path(__file__).resolve().parent.parent
SHAPES = Checkpoints.shapes(Path("/models"))
VALUES = {"scratch": "/scratch", "out": "/out/run"}


def _commands(*, smoke: bool, **kwargs: Any) -> dict[str, Any]:
    checkpoints = Checkpoints.tiny() if smoke else SHAPES
    return {
        run.label: command(stage, run, checkpoints=checkpoints, smoke=smoke, environ={}, values=VALUES, **kwargs)
        for stage in STAGES.values()
        if not (smoke and stage.no_smoke())
        for run in stage.runs
    }


def test_every_run_has_a_label_of_its_own_and_runs_known_parts() -> None:
    """Runs share one output folder: a label names what a run writes there."""
    labels = [run.label for stage in STAGES.values() for run in stage.runs]
    assert len(labels) == len(set(labels))
    for stage in STAGES.values():
        for run in stage.runs:
            if isinstance(run.program, Bench):
                assert set(run.program.parts) <= set(ALL_PARTS), run.label


def test_full_size_commands_serve_the_shapes() -> None:
    commands = _commands(smoke=False, gpu="H100 SXM")
    bf16 = commands["bf16"]
    assert bf16.env["MODEL_NAME"] == "/models/llama8b" and bf16.env["LOAD_FORMAT"] == "dummy"
    assert bf16.argv[1:6] == ["-m", "worker", "bench", "--out", "/out/run"]
    assert "--smoke" not in bf16.argv and bf16.argv[bf16.argv.index("--gpu") + 1] == "H100 SXM"
    assert commands["awq-machete"].env["MODEL_NAME"] == "/models/llama8b-awq"
    assert commands["awq-machete"].env["AWQ_KERNEL"] == "machete"
    # Both servers speculate with the draft at a synthetic acceptance length, under vLLM's config.
    pod_spec = commands["pod-spec"].env
    spec = json.loads(pod_spec["SPECULATIVE_CONFIG"])
    assert spec["model"] == "/models/llama8b-1b" and spec["synthetic_acceptance_length"] == 2.5
    assert pod_spec["SPECULATION_CONTROL"] == "static" and "SPECULATIVE_METHOD" not in pod_spec
    stage = STAGES["pod-spec"]
    mine = {"SPECULATIVE_MODEL": "/elsewhere", "NUM_SPECULATIVE_TOKENS": "5"}
    given = command(stage, stage.runs[0], checkpoints=SHAPES, smoke=False, environ=mine, values=VALUES).env
    assert not set(mine) & set(given) and json.loads(given["SPECULATIVE_CONFIG"]) == spec  # the stage's alone
    eagle3 = commands["spec-map-eagle3"].argv
    assert eagle3[eagle3.index("--configs") + 1].split(";")[1] == "/models/llama8b-eagle3:3:2.5:auto"
    # The cold start's roots are the stage's own, empty at its start; real-size weights load for real.
    real = commands["cold-real-disk"].env
    assert real["VLLM_CACHE_ROOT"] == "/scratch/root" and real["COLDSTART_SERVER_CACHE_ROOT"] == "/scratch/server-root"
    assert real["MODEL_NAME"] == "/models/llama8b-real" and real["LOAD_FORMAT"] == "auto"
    assert real["COLDSTART_EVICT_WEIGHTS"] == "1"
    assert commands["tp2-faults"].argv[1:] == ["scripts/gpu_faults.py", "/out/run/faults.json"]


def test_smoke_commands_run_the_tiny_models_at_the_smoke_sizes() -> None:
    """A smoke run names no shape and asks for no synthetic acceptance (a GPU-only sampler)."""
    commands = _commands(smoke=True)
    assert {"bf16", "pod-spec", "spec-map-draft", "cold-real-disk", "lossless"} <= set(commands)
    for label, cmd in commands.items():
        assert cmd.env["MODEL_NAME"].startswith("tiny:"), label
        assert not any("$" in arg or "/models" in arg for arg in cmd.argv), label
        assert not any("/models" in value or "synthetic" in value for value in cmd.env.values()), label
        assert "--smoke" in cmd.argv or "spec_map" in cmd.argv[2], label
    draft_map = commands["spec-map-draft"].argv
    assert draft_map[draft_map.index("--configs") + 1] == "none;tiny:noisy:3:real:auto;tiny:noisy:3:real:static"
    assert json.loads(commands["pod-spec"].env["SPECULATIVE_CONFIG"])["model"] == "tiny:noisy"
    assert "--lossless-top-p" not in commands["lossless"].argv  # a speculating CPU engine dies on top-p
    assert "--lossless-top-p" in _commands(smoke=False)["lossless"].argv


def test_settings_are_layered_the_last_given_winning() -> None:
    stage = STAGES["tp2-70b"]
    environ = {"MODEL_NAME": "mine", "QUANTIZATION": "awq", "HOME": "/home/x", "PYTHONPATH": "/site"}
    cmd = command(
        stage,
        stage.runs[0],
        checkpoints=SHAPES,
        smoke=False,
        environ=environ,
        values=VALUES,
        overrides={"NUM_SPECULATIVE_TOKENS": "2"},
        extra=["--concurrency", "64", "--out", "$out/x"],
    )
    assert (
        cmd.env["HOME"] == "/home/x" and cmd.env["MODEL_NAME"] == "/models/llama70b"
    )  # the stage's over the environment's
    assert "QUANTIZATION" not in cmd.env and cmd.settings["QUANTIZATION"] is None  # unset for bf16
    assert cmd.env["NUM_SPECULATIVE_TOKENS"] == "2" and cmd.env["TENSOR_PARALLEL_SIZE"] == "2"
    assert cmd.argv[-4:] == ["--concurrency", "64", "--out", "/out/run/x"]  # after the stage's own: they win
    assert cmd.env["PYTHONPATH"] == f"/site:{ROOT}"
    assert set(cmd.settings) == set(SHAPES_ENV) | set(COMMON_ENV) | set(stage.env)


def test_the_stages_settings_are_never_warned_about() -> None:
    names = {key for cmd in _commands(smoke=False).values() for key in cmd.settings}
    assert {"MAX_QUEUE_DEPTH", "POD_BENCH_BASELINE", "COLDSTART_EVICT_WEIGHTS"} <= names
    assert review(dict.fromkeys(names, "1"), {name.upper() for name in Settings.model_fields}).warnings == []


def test_a_speculation_map_configuration_keeps_its_settings_under_the_real_sampler() -> None:
    assert real_sampler("none+TORCH_COMPILE=on") == "none+TORCH_COMPILE=on"
    assert real_sampler("/m/d:3:2.5:auto+MAX_NUM_SEQS=8") == "/m/d:3:real:auto+MAX_NUM_SEQS=8"
    argv = SpecMap(("none", "ngram:4:1.0:auto")).argv(label="m", smoke=True, gpu=None)
    assert argv[argv.index("--configs") + 1] == "none;ngram:4:real:auto"
    assert argv[argv.index("--concurrency") + 1] == "1,2" and argv[argv.index("--repeats") + 1] == "1"


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("Tesla T4", None),
    ],
)
def test_the_roofline_knows_the_card_by_nvidia_smis_name(name: str, label: str | None) -> None:
    assert gpu_label(name) == label


def test_a_stage_without_a_smoke_run_says_why_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--stage", "overhead,spec-map-eagle3", "--smoke", "--out", str(tmp_path)])
    assert info.value.code == 2
    assert "stage spec-map-eagle3 has no smoke run: no tiny stand-in for $eagle3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--stage", "nonesuch"])
    assert "unknown stage(s) nonesuch" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ the runner
# A run's program (``-c``): a server of its own session, its pid written to the run's folder;
# then it holds (ignoring SIGTERM: only SIGKILL ends it) or leaves at once.
PROGRAM = """
import json, pathlib, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
server = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
pathlib.Path(sys.argv[1], "pids.json").write_text(json.dumps({"run": __import__("os").getpid(), "server": server.pid}))
print("serving", flush=True)
if sys.argv[2] == "hold":
    signal.pause()
"""
RUNNER = """
import json, sys
from pathlib import Path
from worker.tools.bench.stage_runner import run_stages
from worker.tools.bench.stages import Checkpoints, Run, Script, Stage
program, out, archive, mode, limit = sys.argv[1:]
stage = Stage("t", "a stage of test runs", (
    Run("first", Script(("-c", program, "$out", mode), "pids.json"), min_s=0),
    Run("second", Script(("-c", "print('second')",)), min_s=5),
))
records = run_stages(
    [stage], out=Path(out), checkpoints=Checkpoints.tiny(), archive=Path(archive),
    time_limit_s=float(limit) if limit != "none" else None, margin_s=0, grace_s=1,
)
print(json.dumps(records))
"""


def _run_stage(tmp_path: Path, mode: str, limit: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    out, archive = tmp_path / "out", tmp_path / "runs.tgz"
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, textwrap.dedent(PROGRAM), str(out), str(archive), mode, limit],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records: list[dict[str, Any]] = json.loads(proc.stdout.splitlines()[-1])
    assert (out / "first" / "pids.json").is_file(), "the run did not start its server before its deadline"
    pids: dict[str, int] = json.loads((out / "first" / "pids.json").read_text())
    # What the runner left behind: nothing of the run (it waited for each process to be gone).
    assert not [name for name, pid in pids.items() if psutil.pid_exists(pid)]
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"./first.log", "./first/pids.json", "./first.json", "./stage-runs.json"} <= names
    assert json.loads((out / "stage-runs.json").read_text()) == records
    return records, pids


def test_a_run_past_its_deadline_is_stopped_with_the_server_it_started(tmp_path: Path) -> None:
    """The run ignores SIGTERM and its server is in a session of its own: both are killed at the
    deadline, the next run (needing more time than is left) is skipped, the archive holds the log."""
    records, _ = _run_stage(tmp_path, "hold", "8")
    first, second = records
    assert first["status"] == "timed out" and first["killed_after"] == 1
    assert second["status"] == "skipped"
    assert (tmp_path / "out" / "first.log").read_text().strip() == "serving"


def test_a_server_left_by_a_run_that_ended_is_stopped(tmp_path: Path) -> None:
    """The run exits at once, leaving its server (now an orphan, adopted by the runner) behind."""
    records, _ = _run_stage(tmp_path, "leave", "none")
    assert [(r["status"], r.get("killed_after")) for r in records] == [("ok", 1), ("ok", 0)]
    assert (tmp_path / "out" / "second.log").read_text().strip() == "second"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_overhead_stage_at_smoke_sizes_on_the_cpu(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """The stage's one run, through `python -m worker bench --stage`: its results, its log, the
    copy of its result file and the archive that holds them."""
    out, archive = tmp_path / "out", tmp_path / "stages.tgz"
    argv = ["--stage", "overhead", "--smoke", "--out", str(out), "--archive", str(archive)]
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "bench", *argv],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + (out / "bf16.log").read_text()[-3000:]
    results = json.loads((out / "bf16" / "bench.json").read_text())
    assert [row["concurrency"] for row in results["overhead"]["rows"]] == [1, 2]
    assert results["label"] == "bf16" and results["roofline"]["weight_bytes_per_step"] > 0
    assert json.loads((out / "bf16.json").read_text()) == results
    (record,) = json.loads((out / "stage-runs.json").read_text())
    assert record["status"] == "ok" and record["settings"]["MODEL_NAME"] == "tiny:target"
    with tarfile.open(archive) as tar:
        assert {"./bf16/bench.json", "./bf16.log", "./bf16.json", "./stage-runs.json"} <= set(tar.getnames())
