"""The worker's vLLM plugin: registered where vLLM looks, and it gets the AMX tiles a process needs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from worker.vllm_plugin import register

# Asks Linux what a fresh process may use (arch_prctl(ARCH_GET_XCOMP_PERM)): bit 18 is the AMX tile
# data, which a process without it cannot touch ("Illegal instruction").
_PERMITS_AMX = """
import ctypes, sys
{before}
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_uint64()
assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0, ctypes.get_errno()
print(bool(mask.value >> 18 & 1))
"""


def _permits_amx(before: str) -> bool:
    code = _PERMITS_AMX.format(before=before)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def test_vllm_loads_the_worker_plugin() -> None:
    from vllm.plugins import load_plugins_by_group

    assert load_plugins_by_group("vllm.general_plugins").get("runpod_worker") is register


@pytest.mark.skipif(
    sys.platform != "linux" or not torch.cpu._is_amx_tile_supported(), reason="the CPU has no AMX tiles"
)
def test_the_plugin_gets_the_amx_tiles_a_fresh_process_lacks() -> None:
    assert _permits_amx("") is False  # what vLLM's AMX kernels would die of
    assert _permits_amx("from worker.vllm_plugin import register; register()") is True
