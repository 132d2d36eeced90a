"""The RunPod SDK's import without py-cpuinfo's subprocess (``worker/sdk.py``), on the real SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cpuinfo
import pytest

from worker import sdk
from worker.sdk import cpu_brand

# Run in a fresh interpreter each: whether the SDK's import starts py-cpuinfo's subprocess, seen
# through subprocess.Popen (py-cpuinfo runs its own cpuinfo.py with --json in a new Python).
PROBE = """
import json, subprocess, sys
spawned = []
popen_init = subprocess.Popen.__init__
def recording_init(self, args, *rest, **kwargs):
    spawned.append(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))
    popen_init(self, args, *rest, **kwargs)
subprocess.Popen.__init__ = recording_init
if sys.argv[1] == "worker":
    from worker.sdk import import_runpod
    runpod = import_runpod()
else:
    import runpod
import cpuinfo
from runpod.serverless.utils import rp_debugger
print(json.dumps({
    "cpuinfo_spawned": [s for s in spawned if "cpuinfo" in s],
    "processor": rp_debugger.PROCESSOR,
    "get_cpu_info": cpuinfo.get_cpu_info.__module__ + "." + cpuinfo.get_cpu_info.__qualname__,
}))
"""


def probe(how: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_sdk_imported_by_the_worker_starts_no_cpuinfo_subprocess_and_puts_py_cpuinfo_back() -> None:
    plain, worker = probe("plain"), probe("worker")
    # The control: the SDK's own import does start py-cpuinfo's subprocess, so the probe can see it.
    assert plain["cpuinfo_spawned"], "the plain import started no py-cpuinfo subprocess: the probe sees nothing"
    assert worker["cpuinfo_spawned"] == []
    assert worker["get_cpu_info"] == plain["get_cpu_info"] == "cpuinfo.cpuinfo.get_cpu_info"
    assert worker["processor"] == sdk.brand_only()["brand_raw"]
    proc = Path("/proc/cpuinfo")
    if proc.exists() and "model name" in proc.read_text():  # x86: py-cpuinfo's own answer is the same name
        assert plain["processor"] == worker["processor"]


def test_py_cpuinfo_is_put_back_when_the_import_fails() -> None:
    original = cpuinfo.get_cpu_info
    with pytest.raises(ImportError), sdk.cpu_brand_in_process():
        assert cpuinfo.get_cpu_info is sdk.brand_only
        raise ImportError("the SDK failed to import")
    assert cpuinfo.get_cpu_info is original


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n",
            "AMD EPYC 9654 96-Core Processor",
        ),
        (
            "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\nmodel name\t: other\n",
            "Intel(R) Xeon(R) Platinum 8480+",
        ),
    ],
)
def test_cpu_brand_is_the_first_model_name(text: str, expected: str) -> None:
    assert cpu_brand(text) == expected


def test_cpu_brand_without_a_model_name_is_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    arm = "processor\t: 0\nBogoMIPS\t: 2000.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd4f\n"
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert cpu_brand(arm) == "aarch64"
    monkeypatch.setattr("platform.machine", lambda: "")
    assert cpu_brand("") == "unknown"
