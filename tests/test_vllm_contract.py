"""The seam's contract (worker/vllm_internals/contract.py) against the installed vLLM, in seconds and
without an engine: every internal the seam relies on exists, with the parameters it is called with
and the attributes it reads or writes; a broken one is named with the module that needs it. And the
contract is in step with the seam's source: every vLLM name the seam imports, and every private
name of vLLM's it touches, is listed."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.errors import UnsupportedVllm, VllmInternalsMissing, to_error_payload
from worker.vllm_internals import check
from worker.vllm_internals.contract import CONTRACT, Internal, entries_for, parse
from worker.vllm_internals.public import PUBLIC_SURFACE
from worker.vllm_internals.release import SUPPORTED, installed_distribution, installed_release, release_of

SEAM = Path(__file__).resolve().parent.parent / "worker" / "vllm_internals"


@pytest.fixture(autouse=True)
def no_stamp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The image's stamp (check.STAMP) moved where none is, so that the boot's check runs; the
    stamp's answer, cached once a process, forgotten before and after."""
    monkeypatch.setattr(check, "STAMP", tmp_path / "contract-checked.json")
    check.forget()
    yield check.STAMP
    check.forget()


def test_the_installed_vllm_keeps_the_contract() -> None:
    problems = check.problems()
    assert not problems, "\n".join(problems)


def test_a_broken_entry_names_the_internal_and_the_module_that_needs_it() -> None:
    free = next(e for e in CONTRACT if e.name == "Scheduler._free_request")
    renamed = dataclasses.replace(free, uses=("request", "delay_free_block"))
    assert check.problem(renamed) == (
        "vllm.v1.core.sched.scheduler.Scheduler._free_request (callable, needed by "
        "worker/vllm_internals/scheduler.py): no parameter 'delay_free_block' (the seam passes it)"
    )
    gone = Internal("vllm.v1.engine.output_processor", "OutputProcessor._finish", "callable", (), "x.py")
    assert check.problem(gone) == (
        "vllm.v1.engine.output_processor.OutputProcessor._finish (callable, needed by x.py): "
        "vllm.v1.engine.output_processor.OutputProcessor has no '_finish'"
    )
    attribute = Internal("vllm.v1.engine.core_client", "BackgroundResources", "class", ("engine_is_dead",), "x.py")
    assert "no attribute 'engine_is_dead'" in str(check.problem(attribute))
    module = Internal("vllm.v1.no_such_module", "Thing", "value", (), "x.py")
    assert "module vllm.v1.no_such_module cannot be imported" in str(check.problem(module))


def test_the_boot_check_fails_loud_naming_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    importlib.import_module("vllm.v1.core.sched.scheduler")  # the check covers imported modules only
    broken = Internal("vllm.v1.core.sched.scheduler", "Scheduler._free_requests", "callable", (), "seam.py")
    installed = check.installed_entries()
    monkeypatch.setattr(check, "installed_entries", lambda: (*installed, broken))
    with pytest.raises(VllmInternalsMissing, match=r"lacks 1 internal\(s\).*Scheduler\._free_requests.*seam\.py"):
        check.require_internals()
    monkeypatch.setattr(check, "installed_entries", lambda: installed)
    check.require_internals()  # the real contract holds


def test_a_stamp_for_this_vllm_spares_the_boot_the_check(monkeypatch: pytest.MonkeyPatch, no_stamp: Path) -> None:
    """The image's build checks every entry once and stamps what held; its boots then skip the check
    (it reads vLLM's class sources: most of the config's build time)."""
    from worker.tools.vllm_contract import main

    assert main(["--stamp"]) == 0
    assert json.loads(no_stamp.read_text())["vllm"] == check.installed_version()
    importlib.import_module("vllm.v1.core.sched.scheduler")
    check.forget(checked=True)  # every imported entry pending, as in a fresh boot

    def checked(*_: object) -> list[str]:
        raise AssertionError("the boot checked the contract despite the stamp")

    monkeypatch.setattr(check, "problems", checked)
    check.require_internals()


def test_a_stamp_for_other_entries_is_not_trusted(monkeypatch: pytest.MonkeyPatch, no_stamp: Path) -> None:
    assert check.write_stamp() == [] and no_stamp.exists()
    importlib.import_module("vllm.v1.core.sched.scheduler")
    broken = Internal("vllm.v1.core.sched.scheduler", "Scheduler._free_requests", "callable", (), "seam.py")
    installed = check.installed_entries()
    monkeypatch.setattr(check, "installed_entries", lambda: (*installed, broken))
    with pytest.raises(VllmInternalsMissing, match=r"Scheduler\._free_requests"):
        check.require_internals()


class _OtherRecord:
    """Stands for the installed vLLM's distribution with other metadata, which a real install cannot
    produce on demand: ``files`` for its RECORD, ``direct_url`` for how it was installed."""

    def __init__(self, real: Any, record: str | None, direct_url: str | None = None) -> None:
        self.real, self.record, self.direct_url = real, record, direct_url

    def read_text(self, name: str) -> str | None:
        return {"RECORD": self.record, "direct_url.json": self.direct_url}.get(name)

    def locate_file(self, path: str) -> Any:
        return self.real.locate_file(path)


@pytest.mark.parametrize(
    ("record", "direct_url"),
    [
        pytest.param("vllm/__init__.py,sha256=other,1\n", None, id="other files"),
        pytest.param(None, None, id="no record"),
        pytest.param(None, '{"dir_info": {"editable": true}}', id="editable"),
    ],
)
def test_a_stamp_is_trusted_for_the_record_it_was_written_for_only(
    monkeypatch: pytest.MonkeyPatch, no_stamp: Path, record: str | None, direct_url: str | None
) -> None:
    assert check.write_stamp() == [] and no_stamp.exists()
    real = installed_distribution()
    if record is None:
        record = real.read_text("RECORD") if direct_url else None
    monkeypatch.setattr(check, "installed_distribution", lambda: _OtherRecord(real, record, direct_url))
    check.forget()
    assert not check.is_stamped()
    # Stamped again: for other files, a stamp of their own; where none can vouch, none is left.
    assert check.write_stamp() == [] and no_stamp.exists() == (record is not None and direct_url is None)


def test_an_unreadable_stamp_is_not_trusted(no_stamp: Path) -> None:
    for text in ("not json", "[1, 2]", '{"vllm": "0.32.0"}'):
        no_stamp.write_text(text)
        check.forget()
        assert not check.is_stamped(), text


def _seam_trees() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(SEAM.glob("*.py"))}


def _listed(module: str, name: str) -> bool:
    """Whether ``module.name`` (as imported) is the start of an entry: defined there, or in a submodule
    of a package that re-exports it."""
    return any(
        e.name.split(".")[0] == name and (e.module == module or e.module.startswith(module + ".")) for e in CONTRACT
    )


def test_every_vllm_name_the_seam_and_the_allowlist_import_is_in_the_contract() -> None:
    imported = {
        (f"{file}:{node.lineno}", node.module, alias.name)
        for file, tree in _seam_trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm"
        for alias in node.names
    }
    imported |= {("public.py", module, name) for module, names in PUBLIC_SURFACE.items() for name in names}
    assert len(imported) > 50
    unlisted = sorted(f"{where}: {module}.{name}" for where, module, name in imported if not _listed(module, name))
    assert not unlisted, "imported from vLLM but not in the contract:\n" + "\n".join(unlisted)


def test_every_private_vllm_name_the_seam_touches_is_in_the_contract() -> None:
    """A private name (``x._name``) the seam uses that a class of the contract has (vLLM's, not the
    seam's own) must be an entry's name or one of its attributes."""
    classes = []
    for entry in check.installed_entries():
        if entry.kind == "class" and "." not in entry.name:
            classes.append(getattr(importlib.import_module(entry.module), entry.name))
    listed = {part for e in CONTRACT for part in (*e.name.split("."), *e.uses)}
    used = {
        (f"{file}:{node.lineno}", node.attr)
        for file, tree in _seam_trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
    }
    vllms = {
        (where, name)
        for where, name in used
        if any(check.has_attribute(c, name) for c in classes if inspect.isclass(c))
    }
    assert {name for _, name in vllms} >= {"_free_request", "_finish_request", "_init_candidates", "_async_client"}
    unlisted = sorted(f"{where}: {name}" for where, name in vllms if name not in listed)
    assert not unlisted, "vLLM's private names the seam touches, not in the contract:\n" + "\n".join(unlisted)


def test_a_failed_seam_import_is_answered_with_the_contracts_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImportError, match="not the contract's"), check.loud_imports():
        raise ImportError("not the contract's")  # the contract holds: the original error stands
    gone = Internal("vllm.v1.engine.gone", "Thing", "value", (), "worker/vllm_internals/x.py")
    installed = check.installed_entries()
    monkeypatch.setattr(check, "installed_entries", lambda: (*installed, gone))
    with pytest.raises(
        VllmInternalsMissing, match=r"vllm\.v1\.engine\.gone\.Thing .*needed by worker/vllm_internals/x\.py"
    ):
        with check.loud_imports():
            raise ImportError("cannot import name 'Thing'")


def test_an_entry_tagged_for_one_release_holds_for_that_release_only() -> None:
    shared = parse("vllm.v1.outputs:ModelRunnerOutput{req_ids}", needed_by="x.py")
    only = parse("0.34 only: vllm.entrypoints.common.cli_args:make_arg_parser(parser)", needed_by="x.py")
    assert shared.releases == SUPPORTED and only.releases == ("0.34",)
    assert only.failure("gone") == (
        "vllm.entrypoints.common.cli_args.make_arg_parser (callable, 0.34 only, needed by x.py): gone"
    )
    with pytest.raises(ValueError, match=r"0\.33 is not a release the seam spans"):
        parse("0.33 only: vllm:SamplingParams", needed_by="x.py")
    by_release = {release: set(entries_for(release)) for release in SUPPORTED}
    assert by_release["0.32"] & by_release["0.34"] == {e for e in CONTRACT if e.releases == SUPPORTED}
    assert {e.qualified for e in by_release["0.32"] - by_release["0.34"]} == {
        "vllm.v1.outputs.ModelRunnerOutput",
        "vllm.v1.core.sched.scheduler.Scheduler",
        "vllm.entrypoints.launchers.cli_args.make_arg_parser",
        # The bench's probes of 0.32's V1 runner and of its sampler's mask of drafts to reject.
        "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer.propose",
        "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer._determine_batch_execution_and_padding",
        "vllm.v1.worker.gpu_model_runner.GPUModelRunner.execute_model",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler.RejectionSampler.__call__",
    }
    assert set(check.installed_entries()) == by_release[installed_release()]


def test_a_vllm_outside_the_window_is_named_in_one_sentence() -> None:
    with pytest.raises(UnsupportedVllm) as raised:
        release_of("0.33.1")
    assert str(raised.value) == (
        "vLLM 0.33.1 is installed, and the worker supports vLLM 0.32 and 0.34 "
        "(the CPU build's 0.32 and the image's 0.34); install one of those"
    )
    assert raised.value.is_fatal and "\n" not in to_error_payload(raised.value)["error"]
