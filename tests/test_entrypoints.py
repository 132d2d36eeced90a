"""handler.py as users run it: import cost, its flags, the local test run, a model from RunPod's cache.
(The SDK's local API server: ``test_reliability.py``.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.boot import prefetch
from worker.serverless import load_test_input
from worker.tiny_models import TinyModels

ROOT = Path(__file__).resolve().parent.parent


def test_import_boots_nothing_and_is_fast(subprocess_env: dict[str, str]) -> None:
    # CPU seconds, not wall seconds: the suite runs beside booting engines on two cores, where the wall time of
    # a 0.2 s import reached 1.5 s; the CPU time of the import is what a heavy module would add.
    code = (
        "import sys, time; t = time.process_time(); import handler; dt = time.process_time() - t; import json; "
        "heavy = sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules); "
        "print(json.dumps({'seconds': dt, 'heavy': heavy, 'engine': handler._worker.holder.engine is not None}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    assert report["engine"] is False
    assert report["seconds"] < 1.0, report


@pytest.mark.parametrize(
    ("argv", "returncode"), [(["--help"], 0), (["--test-input", '{"input": {"prompt": "Zebra"}}'], 2), (["--bogus"], 2)]
)
def test_help_and_unknown_flags_answer_with_the_usage_before_anything_boots(
    subprocess_env: dict[str, str], argv: list[str], returncode: int
) -> None:
    out = subprocess.run(
        [sys.executable, "handler.py", *argv], cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == returncode, out.stderr[-2000:]
    assert "usage: python handler.py" in out.stdout + out.stderr
    if returncode:
        assert f"unrecognized arguments: {argv[0]}" in out.stderr
    # Nothing of a boot began: no engine, no vLLM import (its stamp), no output.
    assert "booting engine" not in out.stderr and "vLLM imported" not in out.stderr and "chunk" not in out.stdout


@pytest.mark.slow
def test_local_test_input_run_streams_and_ends_with_the_blocks(subprocess_env: dict[str, str]) -> None:
    """`python handler.py` with test_input.json: the README's first command, on the default model
    (SmolLM2, converted on first use) with n-gram speculation, whose drafts the answer accepts: the
    job asks for the prompt's code back with one name changed."""
    out = subprocess.run(
        [sys.executable, "handler.py"], cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    chunks = [line for line in lines if "] chunk " in line]
    assert len(chunks) >= 2
    final_at = next(i for i, line in enumerate(lines) if "] final " in line)
    final_text = "\n".join(lines[final_at:])
    final = json.loads(final_text[final_text.index("{") : final_text.rindex("}") + 1])
    assert final["served"]["model"] == "smollm2:135m-instruct"
    assert final["served"]["speculative_method"] == "ngram"
    text = "".join(json.loads(line.split("] chunk ", 1)[1])["text"] for line in chunks) + final["text"]
    assert "total = total + price" in text and "return total" in text, text  # real text, the edit made
    spec = final["spec_decode"]
    assert spec["num_accepted_draft_tokens"] > 0 and spec["mean_acceptance_length"] > 1.5, spec  # copying pays
    # A quiet first run: vLLM's own logging at WARNING, and no warning per weight cast (the models
    # are stored in the dtype they are served in). It was about 170 lines before.
    before_first_chunk = len(out.stderr.splitlines()) + lines.index(chunks[0])
    assert before_first_chunk <= 60, out.stderr[-3000:]
    assert "Attempted to load weight" not in out.stderr
    # stdout is the job's items only: vLLM's own log lines go to stderr.
    assert not [line for line in lines if re.match(r"(\(\w+ pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR) \d", line)]
    # stderr is the worker's own lines: vLLM's, torch's and transformers' warnings of this run need no
    # action (worker/quiet.py lists them, with why), and its progress bar for the weights is off.
    others = [
        line
        for line in out.stderr.splitlines()
        if line.strip() and not re.match(r"[\d-]+ [\d:,]+ [A-Z]+ worker\.", line)
    ]
    assert others == [], out.stderr[-3000:]


def _run_test_input(job: dict[str, Any], *, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`python handler.py --test_input JOB`, its output captured."""
    command = [sys.executable, "handler.py", "--test_input", json.dumps(job)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_a_file_name_given_to_test_input_is_told_what_the_flag_takes(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text('{"input": {"prompt": "hi"}}')
    with pytest.raises(SystemExit) as exit_info:
        load_test_input(str(job))
    assert "takes the job's JSON itself, not a file" in str(exit_info.value.code)
    assert load_test_input(None, default_path=str(job)) == {"prompt": "hi"}


@pytest.mark.slow
def test_a_reader_that_leaves_early_ends_the_local_run_quietly(subprocess_env: dict[str, str]) -> None:
    """`python handler.py ... | head -2`: the job ends when its output's reader is gone, with no
    BrokenPipeError traceback."""
    job = {"input": {"prompt": "Once upon a time", "sampling_params": {"max_tokens": 200, "ignore_eos": True}}}
    command = [sys.executable, "handler.py", "--test_input", json.dumps(job)]
    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert b"] chunk " in proc.stdout.readline()  # the first item streamed
    proc.stdout.close()  # what `head` does once it has its lines
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err[-2000:]


def test_local_test_input_argument_reports_bad_input(subprocess_env: dict[str, str]) -> None:
    bad = {"input": {"prompt": "hi", "sampling_params": {"max_tokens": -1}}}
    out = _run_test_input(bad, env=subprocess_env, timeout_s=120)
    assert out.returncode == 1
    assert "sampling_params.max_tokens" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


@pytest.mark.slow
def test_an_engine_core_dying_at_boot_fails_the_job_with_its_root_cause(subprocess_env: dict[str, str]) -> None:
    """The engine core dies while starting (a KV cache too small for one sequence): vLLM's own
    error says "see root cause above"; the job's error quotes the root cause itself, read from what
    the forked engine core wrote. In a process of its own: under pytest's output capture a forked
    engine core would write to pytest's files instead of the descriptors the boot reads."""
    env = {**subprocess_env, "MODEL_NAME": "tiny:target", "SPECULATIVE_METHOD": "none", "KV_CACHE_MEMORY_BYTES": "4096"}
    out = _run_test_input({"input": {"prompt": "hi"}}, env=env, timeout_s=180)
    assert out.returncode == 1
    error = json.loads(out.stdout[out.stdout.rindex("ERROR {") + len("ERROR ") :].splitlines()[0])
    assert error["error_type"] == "engine_boot_error", error
    assert "ValueError: No available memory for the cache blocks" in error["error"], error
    assert "root cause above" not in error["error"]
    # The worker logs it once (vLLM's own traceback of its engine core stays above it).
    logged = [line for line in out.stderr.splitlines() if re.match(r"[\d-]+ [\d:,]+ [A-Z]+ worker\.", line)]
    assert len([line for line in logged if "No available memory" in line]) == 1, out.stderr[-3000:]


@pytest.mark.slow
def test_a_hub_id_in_runpods_model_cache_is_served_from_it_offline(
    subprocess_env: dict[str, str], tiny_models: TinyModels, tmp_path: Path
) -> None:
    """RunPod's cached-models layout holding the tiny model under a hub id: served with the hub
    unreachable, its weights evicted from the page cache and read back by the prefetch before vLLM
    is imported (the order of the boot's log lines)."""
    repo = tmp_path / "hub" / "models--org--tiny-target"
    snapshot = repo / "snapshots" / "abc123"
    shutil.copytree(tiny_models.target, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    weights = prefetch.weight_files(snapshot)
    for path in weights:
        prefetch.evict(path)
    # (Residency afterwards would not tell the prefetch from vLLM's own load, which reads the
    # files too: tests/test_prefetch.py checks what the prefetch reads.)
    env = {
        **subprocess_env,
        "MODEL_NAME": "org/tiny-target",
        "RUNPOD_MODEL_CACHE_DIR": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "MAX_MODEL_LEN": "512",
        "KV_CACHE_MEMORY_BYTES": str(64 * 2**20),
        "ENFORCE_EAGER": "true",
        "PREFETCH_WEIGHTS": "true",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    job = {"input": {"prompt": "Once upon a time", "stream": False, "sampling_params": {"max_tokens": 4}}}
    out = subprocess.run(
        [sys.executable, "handler.py", "--test_input", json.dumps(job)],
        cwd=ROOT,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert "serving RunPod's cached copy" in out.stdout
    log = out.stdout  # standard error merged in: the lines in the order they were written
    reading = log.index("prefetch: reading 1 weight file(s)")
    assert "prefetch: 0.00 GB read in" in log
    # The weights were being read before vLLM was imported (its first log line) and before its engine started.
    first_vllm_line = re.search(r" vllm\.|\(MainProcess pid=", log)
    assert first_vllm_line is not None and reading < first_vllm_line.start()
    assert reading < log.index("Initializing a V1 LLM engine")
    final_text = out.stdout[out.stdout.index("] final ") :]
    final, _ = json.JSONDecoder().raw_decode(final_text[final_text.index("{") :])  # log lines may follow
    assert final["usage"]["completion_tokens"] == 4 and final["served"]["model"] == "org/tiny-target"


def test_version_is_answered_by_both_entrypoints(capsys: pytest.CaptureFixture[str]) -> None:
    from worker.cli import main as cli_main
    from worker.serverless import local_arg_parser

    for parse in (lambda: cli_main(["--version"]), lambda: local_arg_parser().parse_args(["--version"])):
        with pytest.raises(SystemExit) as exit_info:
            parse()
        assert exit_info.value.code == 0
        assert re.fullmatch(r"runpod-vllm-worker \d+\.\d+\.\d+ \(vLLM \d+\.\d+\.\d+\)\n", capsys.readouterr().out)
