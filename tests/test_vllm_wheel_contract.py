"""The seam's contract on the image's vLLM: its pinned wheel (requirements-image-vllm.txt, the
Dockerfile's VLLM_VERSION) parsed without importing it (worker.tools.vllm_contract), against the
entries of its release. The tests run the CPU build, another release (tests/test_vllm_contract.py
checks that one): this is where an image pin the seam does not fit fails, in seconds.

The wheel is downloaded once by scripts/setup.sh into the wheels folder of the virtual environment
the tests run in (``.venv/wheels/``); without it this test fails, naming the command that fetches it.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

from worker.tools.image_deps import image_spec
from worker.tools.vllm_contract import Sources, check_sources, release_to_check
from worker.vllm_internals.contract import entries_for

ROOT = Path(__file__).resolve().parent.parent
PIN = re.search(
    r"^vllm==(?P<version>\S+) --hash=sha256:(?P<sha256>[0-9a-f]{64})$",
    (ROOT / "requirements-image-vllm.txt").read_text(),
    re.M,
)
WHEELS = Path(sys.prefix) / "wheels"


def _wheel(version: str) -> Path:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    assert found, f"the image's vLLM wheel (vllm=={version}) is not in {WHEELS}: run scripts/setup.sh"
    return found[0]


def test_the_pin_is_the_images_vllm() -> None:
    assert PIN is not None, "requirements-image-vllm.txt pins no `vllm==X --hash=sha256:...`"
    assert PIN["version"] == image_spec((ROOT / "Dockerfile").read_text()).vllm_version


def test_the_images_vllm_wheel_keeps_its_releases_contract() -> None:
    assert PIN is not None
    wheel = _wheel(PIN["version"])
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == PIN["sha256"], f"{wheel} is not the pinned wheel"
    sources = Sources(wheel)
    release, is_supported = release_to_check(sources.version())
    assert sources.version() == PIN["version"] and is_supported, sources.version()
    problems = check_sources(sources, entries_for(release))
    assert not problems, f"vLLM {PIN['version']} breaks the seam's contract:\n" + "\n".join(problems)
