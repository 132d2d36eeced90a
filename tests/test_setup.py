"""scripts/setup.sh's fetch of the lock's `+cpu` wheels, without the internet.

PyPI refuses local version labels, so `torch==2.13.0+cpu` comes from the configured package
sources where they have it (this machine's do), else from PyTorch's CPU index. Each test runs the
script's own fetch step (`--cpu-wheels DIR`, the function the full set-up calls before installing)
with pip's configuration emptied and both places played by local PEP 503 indexes that hold a small
stand-in wheel of each pin: a wheel file named and versioned as the real one, so pip picks it as it
would the real one, with a marker of where it came from.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / "scripts" / "setup.sh"


def cpu_pins() -> list[tuple[str, str]]:
    pins = re.findall(r"^([A-Za-z0-9._-]+)==(\S+\+cpu)$", (ROOT / "requirements-cpu.lock").read_text(), re.M)
    assert pins, "requirements-cpu.lock pins no +cpu wheel: this module tests nothing"
    return pins


def stand_in_wheel(folder: Path, name: str, version: str, *, origin: str) -> Path:
    """A minimal valid wheel for `name==version` whose `origin.txt` says which index served it."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("origin.txt", origin)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def simple_index(root: Path, *, origin: str | None) -> str:
    """A PEP 503 index folder (as a file:// URL) holding a stand-in of each `+cpu` pin, or nothing."""
    root.mkdir()
    if origin is not None:
        for name, version in cpu_pins():
            project = root / re.sub(r"[-_.]+", "-", name).lower()
            project.mkdir()
            wheel = stand_in_wheel(project, name, version, origin=origin)
            link = quote(wheel.name)
            (project / "index.html").write_text(f'<html><body><a href="{link}">{wheel.name}</a></body></html>\n')
    return root.as_uri()


def fetch(dest: Path, *, index_url: str, fallback_url: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs the set-up's fetch step with pip's configuration replaced by `index_url` alone."""
    # No config file (this machine's names local wheel folders and a constraint file), no PIP_*
    # variable from outside (PIP_FIND_LINKS names the folder holding the real wheel).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": index_url,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "TORCH_CPU_INDEX_URL": fallback_url,
        "PYTHON": sys.executable,
    }
    return subprocess.run(
        ["bash", str(SETUP), "--cpu-wheels", str(dest)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def origins(dest: Path) -> dict[str, str]:
    found = {}
    for wheel in dest.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            found[wheel.name] = archive.read("origin.txt").decode()
    return found


def expected_wheels() -> set[str]:
    return {f"{name.replace('-', '_')}-{version}-py3-none-any.whl" for name, version in cpu_pins()}


def test_configured_sources_come_first(tmp_path: Path) -> None:
    configured = simple_index(tmp_path / "configured", origin="configured")
    fallback = simple_index(tmp_path / "fallback", origin="fallback")
    result = fetch(tmp_path / "dest", index_url=configured, fallback_url=fallback)
    assert result.returncode == 0, result.stdout + result.stderr
    assert origins(tmp_path / "dest") == dict.fromkeys(expected_wheels(), "configured")
    assert "fetching it from" not in result.stdout


def test_pytorch_cpu_index_when_the_configured_sources_lack_the_wheel(tmp_path: Path) -> None:
    configured = simple_index(tmp_path / "configured", origin=None)
    fallback = simple_index(tmp_path / "fallback", origin="fallback")
    result = fetch(tmp_path / "dest", index_url=configured, fallback_url=fallback)
    assert result.returncode == 0, result.stdout + result.stderr
    assert origins(tmp_path / "dest") == dict.fromkeys(expected_wheels(), "fallback")
    for name, version in cpu_pins():
        assert f"setup: {name}=={version} is not in the configured package sources; fetching it from {fallback}" in (
            result.stdout
        )


def test_neither_place_has_the_wheel(tmp_path: Path) -> None:
    configured = simple_index(tmp_path / "configured", origin=None)
    fallback = simple_index(tmp_path / "fallback", origin=None)
    result = fetch(tmp_path / "dest", index_url=configured, fallback_url=fallback)
    assert result.returncode != 0
    name, version = cpu_pins()[0]
    assert f"setup: {name}=={version} is neither in the configured package sources nor at {fallback}" in result.stderr
    assert not origins(tmp_path / "dest")


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index that accepts connections and never answers (a firewalled or hung host)."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/whl/cpu"


@pytest.mark.slow  # ~20 s: two attempts of the fallback's 10 s timeout
def test_an_unanswering_fallback_index_fails_in_seconds(tmp_path: Path, silent_index: str) -> None:
    configured = simple_index(tmp_path / "configured", origin=None)
    # A bounded wait for the fetch to give up: pip's defaults (15 s, 5 retries with back-off;
    # PIP_DEFAULT_TIMEOUT here is 180 s) would still be waiting at the bound.
    try:
        result = fetch(tmp_path / "dest", index_url=configured, fallback_url=silent_index, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the fetch still waited after 60 s on an index that never answers")
    assert result.returncode != 0
    assert "is neither in the configured package sources nor at" in result.stderr
