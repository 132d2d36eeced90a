"""The RunPod SDK, imported for the serverless entry without the second its import spends timing the CPU.

``import runpod`` imports ``runpod.serverless.utils.rp_debugger``, which asks py-cpuinfo for the
CPU's brand at import time, for the report of the SDK's ``--rp_debugger`` flag only. py-cpuinfo
answers from a new Python subprocess which, on x86, also times the clock by sleeping 1 s: every
worker waited that long before it could fetch its first job (docs/gpu-results/HISTORY.md, "The
levers, and what each did"). Neither the SDK nor py-cpuinfo has a switch for it, so it is done here
by hand: while the SDK is imported, py-cpuinfo's ``get_cpu_info`` answers the brand from
``/proc/cpuinfo`` in this process, and it is put back right after, so anything that asks py-cpuinfo
later (vLLM's usage report reads the CPU's family, model and count) gets py-cpuinfo's full answer.
"""

from __future__ import annotations

import contextlib
import platform
import types
from collections.abc import Iterator
from pathlib import Path

__all__ = ["brand_only", "cpu_brand", "cpu_brand_in_process", "import_runpod"]

PROC_CPUINFO = Path("/proc/cpuinfo")


def cpu_brand(cpuinfo_text: str) -> str:
    """The CPU's name for the SDK's debugger report: the first ``model name`` of ``/proc/cpuinfo``,
    as py-cpuinfo's ``brand_raw`` gives it on x86. ARM's ``/proc/cpuinfo`` has none (py-cpuinfo then
    asks lscpu, a subprocess): the machine's architecture instead (``platform.machine``, no
    subprocess, unlike ``platform.processor``)."""
    for line in cpuinfo_text.splitlines():
        key, is_pair, value = line.partition(":")
        if is_pair and key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.machine() or "unknown"


def brand_only() -> dict[str, str]:
    """py-cpuinfo's answer reduced to the brand, from ``/proc/cpuinfo`` in this process."""
    try:
        text = PROC_CPUINFO.read_text(errors="replace")
    except OSError:  # not Linux, or no /proc in this container
        text = ""
    return {"brand_raw": cpu_brand(text)}


@contextlib.contextmanager
def cpu_brand_in_process() -> Iterator[None]:
    """py-cpuinfo's ``get_cpu_info`` answered by :func:`brand_only` inside the block, put back after."""
    import cpuinfo  # the SDK's own dependency (py-cpuinfo)

    original = cpuinfo.get_cpu_info
    cpuinfo.get_cpu_info = brand_only
    try:
        yield
    finally:
        cpuinfo.get_cpu_info = original


def import_runpod() -> types.ModuleType:
    """``import runpod``, its CPU probe answered in this process (the module docstring says why)."""
    with cpu_brand_in_process():
        import runpod
    module: types.ModuleType = runpod
    return module
