"""The Docker image's Python dependency set, resolved without a Docker engine.

The image is the official vLLM image (``vllm/vllm-openai`` at the Dockerfile's ``VLLM_VERSION``)
with ``requirements-worker.lock`` installed ``--no-deps`` on top. :func:`check_image_dependencies`
checks that every pin of that lock is the version the tests run with (``requirements-cpu.lock``),
then has pip resolve ``vllm==VLLM_VERSION`` with two of vLLM's own pins the worker relies on
(``torch==TORCH_VERSION`` and ``nvidia-cutlass-dsl[cu13]==CUTLASS_DSL_VERSION``, which the image
build checks against its base image) together with the lock for the image's Python (the
Dockerfile's ``PYTHON_VERSION``, checked the same way) and platform (manylinux x86_64), and raises
:class:`ImageDependencyError` naming the conflicting pair.
``scripts/lock_worker.py`` runs it before writing the lock; ``tests/test_image_deps.py`` runs it in CI.

A pin of vLLM's that PyPI does not serve (:data:`BASE_IMAGE_ONLY`: the base image brings its own
build) is given to pip as a stand-in wheel of that name and version, without dependencies.

It needs the package index (PyPI) and an interpreter of the image's Python: pip evaluates
environment markers (``; python_version < "3.12"``) for the interpreter it runs under, whatever
``--python-version`` says (pypa/pip#13296), so the resolution runs under that interpreter.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BASE_IMAGE_ONLY",
    "ImageDependencyError",
    "ImageSpec",
    "Resolution",
    "canonical",
    "check_image_dependencies",
    "conflict_summary",
    "find_interpreter",
    "image_spec",
    "lock_disagreements",
    "pip_environment",
    "read_pins",
    "resolve",
    "stand_in_wheel",
]

# The vLLM image is built on Ubuntu 22.04 (glibc 2.35): wheels up to manylinux_2_35 install there.
IMAGE_GLIBC_MINOR = 35
IMAGE_PLATFORMS = [
    *(f"manylinux_2_{minor}_x86_64" for minor in range(IMAGE_GLIBC_MINOR, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
# vLLM's pins that PyPI does not serve, by canonical name: vLLM 0.34.0 pins flashinfer-python==0.7.3,
# and PyPI has 0.7.2.post1 and 0.7.4 only. The image's base brings its own build; the resolution
# takes a stand-in (name and version only), so that the rest of the set is still resolved.
BASE_IMAGE_ONLY = {"flashinfer-python": "0.7.3"}
# Pip settings kept from the environment: how to reach the index (a mirror, a proxy, a CA bundle).
_NETWORK_SETTINGS = {
    "PIP_INDEX_URL",
    "PIP_CERT",
    "PIP_CLIENT_CERT",
    "PIP_PROXY",
    "PIP_TRUSTED_HOST",
    "PIP_CACHE_DIR",
    "PIP_DEFAULT_TIMEOUT",
}


class ImageDependencyError(Exception):
    """The image's dependency set is not what the locks say (the message names what and where)."""


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """What the Dockerfile says of the image: the vLLM release, the Python of its base image, and
    the versions of two of vLLM's own pins the worker relies on (torch; the CUTLASS DSL, which
    vLLM 0.34's kernel warm-up imports on every CUDA boot)."""

    vllm_version: str
    python_version: str
    torch_version: str
    cutlass_dsl_version: str

    def base_requirements(self) -> list[str]:
        """What the base image holds of the set, as requirements."""
        return [
            f"vllm=={self.vllm_version}",
            f"torch=={self.torch_version}",
            f"nvidia-cutlass-dsl[cu13]=={self.cutlass_dsl_version}",
        ]

    def base_versions(self) -> dict[str, str]:
        """The same, by canonical name."""
        return {
            "vllm": self.vllm_version,
            "torch": self.torch_version,
            "nvidia-cutlass-dsl": self.cutlass_dsl_version,
        }


@dataclass(frozen=True, slots=True)
class Resolution:
    """pip's answer: the Python its markers were evaluated for, and each package's version."""

    python_version: str
    versions: dict[str, str]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """The ``name==version`` lines of a lock file, by canonical name."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def image_spec(dockerfile: str) -> ImageSpec:
    def arg(name: str) -> str:
        found = re.search(rf"^ARG {name}=(\S+)$", dockerfile, re.M)
        if found is None:
            raise ImageDependencyError(f"the Dockerfile has no `ARG {name}=...` line")
        return found.group(1)

    return ImageSpec(
        vllm_version=arg("VLLM_VERSION"),
        python_version=arg("PYTHON_VERSION"),
        torch_version=arg("TORCH_VERSION"),
        cutlass_dsl_version=arg("CUTLASS_DSL_VERSION"),
    )


def lock_disagreements(worker_pins: Mapping[str, str], cpu_pins: Mapping[str, str]) -> list[str]:
    """One line per pin of the worker lock that is not the CPU lock's (the versions the tests run)."""
    return [
        f"{name}: requirements-worker.lock pins {version}, requirements-cpu.lock "
        + (f"pins {cpu_pins[name]}" if name in cpu_pins else "has no pin")
        for name, version in sorted(worker_pins.items())
        if cpu_pins.get(name) != version
    ]


def find_interpreter(version: str) -> str:
    """A Python ``version`` interpreter: ``python<version>`` on PATH, else one under pyenv."""
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [
        shutil.which(f"python{version}"),
        *sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"), reverse=True),
    ]
    for candidate in candidates:
        if candidate is None:
            continue
        # A pyenv shim is on PATH even where its version is not selected: ask the interpreter itself.
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    raise ImageDependencyError(
        f"no Python {version} interpreter found (python{version} on PATH, or under pyenv): the image's "
        "dependency set is resolved under its own Python, since pip evaluates markers for the one it runs under"
    )


def pip_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment pip resolves the image's set in: no pip config file, no pip variable but the
    network settings. A machine's own pip configuration describes that machine (this one's adds a
    constraint file capping torch and local wheel folders built for its Python 3.11), not the
    image: read, it would make the resolution refuse or pick versions the image's pip would not."""
    env = {k: v for k, v in environ.items() if not k.startswith("PIP_") or k in _NETWORK_SETTINGS}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def conflict_summary(pip_stderr: str) -> str:
    """pip's reason for failing, in one paragraph: the pair it cannot install together and the
    requirements that clash, or the requirement that has no wheel for the image."""
    lines = pip_stderr.splitlines()
    summary = [line.removeprefix("ERROR: ").strip() for line in lines if line.startswith("ERROR: Cannot install")]
    if "The conflict is caused by:" in lines:
        start = lines.index("The conflict is caused by:") + 1
        causes = []
        for line in lines[start:]:
            if not line.strip():
                break
            causes.append(line.strip())
        summary.append("The conflict is caused by: " + "; ".join(causes) + ".")
    summary += [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: No matching distribution")]
    if not summary:
        summary = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: ")] or lines[-5:]
    return " ".join(summary)


def resolve(requirements: Sequence[str], *, spec: ImageSpec, interpreter: str) -> Resolution:
    """pip's resolution of ``requirements`` for the image's Python and platform (nothing installed)."""
    with tempfile.TemporaryDirectory() as folder:
        report_path = Path(folder) / "report.json"
        stand_ins = Path(folder) / "stand-ins"
        stand_ins.mkdir()
        for name, version in BASE_IMAGE_ONLY.items():
            stand_in_wheel(stand_ins, name, version)
        command = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            interpreter,
            "install",
            "--dry-run",
            "--ignore-installed",
            # Not --quiet: pip says which requirements clash at its default verbosity only.
            "--report",
            str(report_path),
            # Metadata by HTTP range requests: an index that serves no separate metadata files (PEP 658)
            # would otherwise have pip download every wheel, gigabytes of CUDA libraries here.
            "--use-feature=fast-deps",
            "--only-binary=:all:",
            "--find-links",
            str(stand_ins),
            "--python-version",
            spec.python_version,
            *(arg for platform in IMAGE_PLATFORMS for arg in ("--platform", platform)),
            *requirements,
        ]
        result = subprocess.run(command, capture_output=True, text=True, env=pip_environment(os.environ))
        if result.returncode != 0:
            raise ImageDependencyError(
                f"pip cannot resolve {', '.join(spec.base_requirements())} with requirements-worker.lock for Python "
                f"{spec.python_version} on manylinux x86_64: {conflict_summary(result.stdout + result.stderr)}"
            )
        report = json.loads(report_path.read_text())
    return Resolution(
        python_version=report["environment"]["python_version"],
        versions={canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]},
    )


def stand_in_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of ``name`` at ``version`` that holds nothing and requires nothing: what pip is given
    for a package the base image brings and PyPI does not serve."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def check_image_dependencies(
    *, worker_pins: Mapping[str, str], cpu_pins: Mapping[str, str], spec: ImageSpec
) -> Resolution:
    """Raises ImageDependencyError unless the worker lock is the tested versions and resolves with
    the image's vLLM for the image's Python; returns the resolution."""
    disagreements = lock_disagreements(worker_pins, cpu_pins)
    if disagreements:
        raise ImageDependencyError("the worker lock is not the tested versions: " + "; ".join(disagreements))
    requirements = [*spec.base_requirements(), *(f"{name}=={version}" for name, version in sorted(worker_pins.items()))]
    resolution = resolve(requirements, spec=spec, interpreter=find_interpreter(spec.python_version))
    if resolution.python_version != spec.python_version:
        raise ImageDependencyError(
            f"the resolution assumed Python {resolution.python_version}; the image has {spec.python_version}"
        )
    return resolution
