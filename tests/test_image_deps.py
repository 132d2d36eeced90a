"""The Docker image's dependency set (worker.tools.image_deps): vLLM at the Dockerfile's version with
requirements-worker.lock, resolved by pip from PyPI for the image's Python and platform. The slow
tests need PyPI (1-2 minutes: pip reads each wheel's metadata by range requests)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker.tools.image_deps import (
    ImageDependencyError,
    check_image_dependencies,
    image_spec,
    lock_disagreements,
    pip_environment,
    read_pins,
)

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()
SPEC = image_spec(DOCKERFILE)
WORKER_PINS = read_pins((ROOT / "requirements-worker.lock").read_text())
CPU_PINS = read_pins((ROOT / "requirements-cpu.lock").read_text())


def test_the_dockerfile_checks_the_python_the_resolution_assumes() -> None:
    assert re.fullmatch(r"3\.\d+", SPEC.python_version), SPEC
    after_from = DOCKERFILE.split("\nFROM ", 1)[1]
    # The build compares its base image's python3 with the same ARG the resolution reads.
    check = re.search(r"^RUN python3 -c .*sys\.version_info.*\n.*'\$\{PYTHON_VERSION\}'", after_from, re.M)
    assert check is not None, "the Dockerfile no longer checks its base image's Python against PYTHON_VERSION"


def test_the_dockerfile_checks_the_base_images_pins_the_resolution_assumes() -> None:
    after_from = DOCKERFILE.split("\nFROM ", 1)[1].replace("\\\n", "")  # continuation lines joined
    checks = [line for line in after_from.splitlines() if line.startswith("RUN python3 -c") and "importlib" in line]
    assert len(checks) == 1, "the Dockerfile no longer checks its base image's vLLM, torch and CUTLASS DSL"
    for arg in ("VLLM_VERSION", "TORCH_VERSION", "CUTLASS_DSL_VERSION"):
        assert f"'${{{arg}}}'" in checks[0], arg
    assert set(SPEC.base_versions()) == {"vllm", "torch", "nvidia-cutlass-dsl"}


def test_a_worker_pin_off_the_tested_version_is_named() -> None:
    assert lock_disagreements({"runpod": "1.10.0", "boto3": "1.0"}, {"runpod": "1.9.0"}) == [
        "boto3: requirements-worker.lock pins 1.0, requirements-cpu.lock has no pin",
        "runpod: requirements-worker.lock pins 1.10.0, requirements-cpu.lock pins 1.9.0",
    ]
    with pytest.raises(ImageDependencyError, match=r"runpod: requirements-worker\.lock pins 1\.10\.0"):
        check_image_dependencies(worker_pins={"runpod": "1.10.0"}, cpu_pins={"runpod": "1.9.0"}, spec=SPEC)


def test_the_resolution_ignores_this_machines_pip_configuration() -> None:
    env = pip_environment(
        {
            "PIP_CONSTRAINT": "/etc/caps.txt",
            "PIP_FIND_LINKS": "/opt/wheels",
            "PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple",
            "PIP_INDEX_URL": "https://mirror.example/simple",
            "PIP_CERT": "/etc/ssl/ca.pem",
            "HOME": "/root",
        }
    )
    assert env == {
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_CERT": "/etc/ssl/ca.pem",
        "HOME": "/root",
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


@pytest.mark.slow  # PyPI: 1-2 min (63-132 s measured here, under load)
def test_the_image_dependency_set_resolves() -> None:
    resolution = check_image_dependencies(worker_pins=WORKER_PINS, cpu_pins=CPU_PINS, spec=SPEC)
    assert resolution.python_version == SPEC.python_version
    assert {name: resolution.versions.get(name) for name in SPEC.base_versions()} == SPEC.base_versions()
    assert {name: resolution.versions.get(name) for name in WORKER_PINS} == WORKER_PINS


@pytest.mark.slow  # PyPI: 15-35 s (pip stops at vLLM's own requirement)
def test_a_conflicting_pin_is_named_with_what_it_conflicts_with() -> None:
    pins = WORKER_PINS | {"pydantic": "1.10.13"}  # vLLM requires pydantic 2
    with pytest.raises(ImageDependencyError) as raised:
        check_image_dependencies(worker_pins=pins, cpu_pins=pins, spec=SPEC)
    message = str(raised.value)
    assert "Cannot install pydantic==1.10.13 and vllm==" in message, message
    assert f"vllm {SPEC.vllm_version} depends on pydantic>=" in message, message
