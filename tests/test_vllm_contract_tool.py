"""``python -m worker vllm-contract``: the contract checked on vLLM's sources without importing them,
here on a small synthetic "wheel" (a folder, then the same zipped) and on the installed vLLM's own
sources, which must keep the contract as the import-based check finds it does."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from worker.tools import vllm_contract
from worker.tools.vllm_contract import Sources, check_sources
from worker.vllm_internals.contract import Internal, entries_for, parse
from worker.vllm_internals.release import installed_release

_FILES = {
    "vllm/__init__.py": 'MODULE_ATTRS = {"Params": ".params:Params"}\n',
    "vllm/_version.py": "__version__ = version = '9.9.9'\n",
    "vllm/params.py": "import msgspec\n\nclass Params(msgspec.Struct):\n    stop: list[str]\n    n: int = 1\n",
    "vllm/core/__init__.py": "from .sched import Scheduler as Scheduler, Status\n",
    "vllm/core/base.py": (
        "class Base:\n"
        "    def __init__(self, config, *, log_stats=False):\n"
        "        self.requests = {}\n"
        "        self.running, self._ring = [], None\n\n"
        "    def _free_request(self, request, delay_free_blocks=False):\n"
        "        return None\n"
    ),
    "vllm/core/sched.py": (
        "import enum\n"
        "from typing import TYPE_CHECKING\n"
        "from .base import Base\n\n"
        "if TYPE_CHECKING:\n"
        "    from vllm.params import Params\n\n"
        "class Status(enum.Enum):\n"
        "    RUNNING = enum.auto()\n\n"
        "class Scheduler(Base):\n"
        "    max_steps: int = 8\n\n"
        "    @property\n"
        "    def is_idle(self):\n"
        "        return not self.running\n\n"
        "    def schedule(self, throttle_prefills: bool = False):\n"
        "        self.last: Params | None = None\n"
    ),
}


def _entries(*lines: str) -> tuple[Internal, ...]:
    return tuple(parse(line, needed_by="worker/seam.py") for line in lines)


HOLDING = _entries(
    "vllm:Params{stop, n}",
    "vllm:Params(stop, n)",
    "vllm.core:Scheduler{requests, running, _ring, max_steps, is_idle, last}",
    "vllm.core:Scheduler(config, log_stats)",
    "vllm.core:Scheduler._free_request(request, delay_free_blocks)",
    "vllm.core.sched:Scheduler.schedule(throttle_prefills)",
    "vllm.core:Status.RUNNING",
)


@pytest.fixture(params=["folder", "wheel"])
def sources(request: pytest.FixtureRequest, tmp_path: Path) -> Sources:
    root = tmp_path / "site"
    for name, text in _FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    if request.param == "folder":
        return Sources(root)
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in _FILES:
            archive.write(root / name, name)
    return Sources(wheel)


def test_a_synthetic_wheel_keeps_what_it_defines(sources: Sources) -> None:
    assert sources.version() == "9.9.9"
    assert check_sources(sources, HOLDING) == []


def test_a_synthetic_wheel_names_each_break(sources: Sources) -> None:
    broken = _entries(
        "vllm.core:Scheduler._free_request(request, delay_free_block)",
        "vllm.core:Scheduler{requests, waiting}",
        "vllm.core:Scheduler._free_requests()",
        "vllm.core:Status.FINISHED",
        "vllm.gone:Thing",
    )
    assert check_sources(sources, broken) == [
        "vllm.core.Scheduler._free_request (callable, needed by worker/seam.py): no parameter 'delay_free_block' "
        "(the seam passes it)",
        "vllm.core.Scheduler (class, needed by worker/seam.py): no attribute 'waiting' (the seam reads or writes it)",
        "vllm.core.Scheduler._free_requests (callable, needed by worker/seam.py): vllm.core.Scheduler has no "
        "'_free_requests'",
        "vllm.core.Status.FINISHED (value, needed by worker/seam.py): vllm.core.Status has no 'FINISHED'",
        "vllm.gone.Thing (value, needed by worker/seam.py): module vllm.gone is not in this vLLM",
    ]


def test_the_installed_vllms_sources_keep_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert vllm_contract.main(["--installed"]) == 0
    release = installed_release()
    total = len(entries_for(release))
    assert f": {total} of {total} contract entries for {release} hold" in capsys.readouterr().out


def test_sources_are_checked_against_their_releases_entries() -> None:
    assert vllm_contract.release_to_check("0.32.0+cpu") == ("0.32", True)
    assert vllm_contract.release_to_check("0.34.0") == ("0.34", True)
    assert vllm_contract.release_to_check("9.9.9") == ("0.34", False)  # an upgrade keeps the newest's
