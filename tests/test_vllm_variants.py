"""The seam's release variants (worker/vllm_internals/variants.py): each release's picked when the
module loads, both giving the seam the same answers, and a release outside the window refused with
one sentence. The installed CPU build is 0.32; the 0.34 variants are loaded here as a second copy of
the module with the release read as 0.34 (their vLLM imports are checked on the 0.34 wheel by
tests/test_vllm_wheel_contract.py), on the stand-ins of vLLM's objects they read."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from worker.errors import UnsupportedVllm
from worker.vllm_internals import release, variants


def _load(monkeypatch: pytest.MonkeyPatch, version: str) -> ModuleType:
    """A fresh copy of the variants module, loaded where the installed vLLM reads as ``version``."""
    monkeypatch.setattr(release, "installed_version", lambda: version)
    spec = importlib.util.spec_from_file_location(f"variants_{version}", variants.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installed_release_picks_its_variants() -> None:
    assert variants.RELEASE == release.installed_release() == "0.32"  # the CPU build
    parser = variants.server_arg_parser()
    assert parser.parse_args(["--model", "m", "--served-model-name", "s"]).served_model_name == ["s"]


@pytest.mark.parametrize("version", ["0.32.0+cpu", "0.34.0"])
def test_each_release_finds_a_requests_row_and_its_runner(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    loaded = _load(monkeypatch, version)
    # A stand-in of the model runner's output with both releases' fields (0.34's has req_ids only).
    output: Any = SimpleNamespace(req_ids=["a", "b", "c"], req_id_to_index={"a": 0, "b": 1, "c": 2})
    assert dict(loaded.row_index(output)) == {"a": 0, "b": 1, "c": 2}
    v1_scheduler: Any = SimpleNamespace(use_v2_model_runner=False)
    # 0.32 asks its scheduler which GPU runner runs; 0.34 has only V2.
    assert loaded.runs_v2_model_runner(v1_scheduler) is (loaded.RELEASE == "0.34")


def test_a_vllm_outside_the_window_fails_the_seams_load_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UnsupportedVllm) as raised:
        _load(monkeypatch, "0.33.0")
    assert str(raised.value).startswith("vLLM 0.33.0 is installed, and the worker supports vLLM 0.32 and 0.34")


@pytest.mark.slow  # imports vLLM in a process of its own: 5-20 s
def test_a_boot_on_a_vllm_outside_the_window_fails_with_one_line(subprocess_env: dict[str, str]) -> None:
    """The serverless boot in a fresh process where the installed vLLM reads as 0.33.0: the seam's
    load refuses it before any engine starts, and the boot's error is that one sentence."""
    script = (
        "import asyncio, json, logging; logging.basicConfig(level=logging.ERROR); "
        "from worker.vllm_internals import release; release.installed_version = lambda: '0.33.0'; "
        "from worker.runtime import EngineHolder; from worker.errors import to_error_payload; "
        "holder = EngineHolder()\n"
        "try:\n    asyncio.run(holder.get())\n"
        "except Exception as exc:\n    print('PAYLOAD', json.dumps(to_error_payload(exc)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env, capture_output=True, text=True, timeout=180, check=False
    )
    sentence = (
        "vLLM 0.33.0 is installed, and the worker supports vLLM 0.32 and 0.34 "
        "(the CPU build's 0.32 and the image's 0.34); install one of those"
    )
    assert f"engine boot failed: {sentence}\n" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    payload = json.loads(out.stdout.split("PAYLOAD ", 1)[1])
    assert payload == {"error": sentence, "error_type": "engine_boot_error"}
