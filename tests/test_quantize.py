"""AWQ end to end on the tiny model: quantize in .venv-quant, then serve with the worker's engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import boot_engine
from worker.schema import parse_request
from worker.tools.quantize import linear_bytes

pytestmark = pytest.mark.slow  # every test here boots an engine or a server

ROOT = Path(__file__).resolve().parent.parent


def cpu_has_4bit_gemm() -> bool:
    """vLLM's CPU build serves 4-bit weights with its ``cpu_gemm_wna16`` kernel, which exists in
    its AVX-512 library only: on a CPU without AVX-512 vLLM loads the AVX2 library, and the first
    forward pass of a 4-bit model kills the engine."""
    import torch
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return hasattr(torch.ops._C, "cpu_gemm_wna16")


@pytest.fixture(scope="module")
def awq_model(tiny_models: Any, tmp_path_factory: pytest.TempPathFactory, subprocess_env: dict[str, str]) -> Path:
    out = tmp_path_factory.mktemp("quant") / "tiny-awq"
    result = subprocess.run(
        [sys.executable, "-m", "worker", "quantize", "--model", "tiny:target", "--out", str(out)],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not out.with_name(out.name + ".calibration.json").exists()  # the job's own input, not left behind
    report = json.loads(result.stdout[result.stdout.rindex("{\n") :])
    print("QUANTIZE " + json.dumps(report))
    return out


@pytest.mark.timeout(1500)
def test_awq_shrinks_the_linear_weights_to_about_a_quarter(awq_model: Path, tiny_models: Any) -> None:
    before = linear_bytes(tiny_models.target)  # the tiny model is stored in bfloat16
    after = linear_bytes(awq_model)
    # 4-bit weights plus a scale and a zero point per group of 128: a quarter of bf16, plus a little.
    assert 0.25 < after / before < 0.30
    config = json.loads((awq_model / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"


async def test_the_worker_serves_the_awq_checkpoint(awq_model: Path, tiny_models: Any) -> None:
    if not cpu_has_4bit_gemm():
        pytest.skip("this CPU has no AVX-512, so vLLM's CPU build has no 4-bit GEMM kernel to serve AWQ with")
    engine = await boot_engine(
        tiny_models,
        MODEL_NAME=str(awq_model),
        SPECULATIVE_METHOD="none",
        KV_CACHE_MEMORY_BYTES=2**28,
        ENFORCE_EAGER="true",
        MAX_MODEL_LEN=1024,
    )
    try:
        assert engine.served.quantization == "compressed-tensors"
        request = parse_request(
            {
                "messages": [{"role": "user", "content": "Tell me a story."}],
                "sampling_params": {"temperature": 0, "max_tokens": 40},
            }
        )
        chunks = [chunk async for chunk in engine.generate(request)]
        text = "".join(c.text for c in chunks)
        assert text.startswith("Once upon a time"), text  # the 4-bit model still tells its story
    finally:
        engine.shutdown()


@pytest.mark.parametrize("folder", ["tiny-awq", "model-awq"])
def test_the_readmes_quantize_outputs_are_ignored_by_git(folder: str) -> None:
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{folder}/config.json"], cwd=root, check=False)
    assert ignored.returncode == 0, f"{folder}/ (README: quantize --out ./{folder}) is not in .gitignore"
