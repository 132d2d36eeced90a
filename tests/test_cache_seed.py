"""CACHE_SEED: an empty cache root starts from the image's seed, folder by folder, each entry whole;
a folder with anything in it, a seed that is empty or not there, and a copy that fails leave the
root as it was, and never fail the boot."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from worker.boot import modelinfo, prefetch
from worker.boot.cache_seed import FOLDERS, seed_cache_root
from worker.boot.plan import build_plan
from worker.config import load_settings


def _kernels(directory: Path, keys: tuple[str, ...] = ("3f2a", "9c1b")) -> Path:
    """A cache as Triton lays one out: a folder per kernel hash, its files and a group file."""
    directory.mkdir(parents=True, exist_ok=True)
    for key in keys:
        kernel = directory / key
        kernel.mkdir()
        (kernel / "kernel.cubin").write_bytes(os.urandom(64))
        (kernel / f"__grp__{key}.json").write_text('{"child_paths": {}}')
    return directory


SEEDED = ("modelinfos", "startup_plan", "triton_cache")


def _seed(root: Path) -> Path:
    """A test job's cache root: Triton's kernels, vLLM's model-class answer, its startup plan; and
    what is not seeded: a file at the top (vLLM's GPU peer-access answer, keyed by device indices
    alone) and a staging folder a killed worker left."""
    _kernels(root / "triton_cache")
    (root / "modelinfos").mkdir(parents=True)
    (root / "modelinfos" / "vllm-model_executor-models-llama-LlamaForCausalLM.json").write_text('{"hash": "ab"}')
    (root / "startup_plan").mkdir()
    (root / "startup_plan" / "startup_plan_0123.json").write_text('{"kv_cache_memory_bytes": 1}')
    (root / "gpu_p2p_access_cache_for_0.json").write_text("{}")
    (root / "modelinfos.seeding-x1y2").mkdir()
    return root


def _seeded_files(root: Path) -> dict[str, bytes]:
    """The files of ``root``'s seeded folders."""
    return {k: v for k, v in _files(root).items() if k.split("/")[0] in SEEDED}


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def seed(
    seed: Path | str | None, root: Path, *, triton: Path | None = None, folders: tuple[str, ...] = FOLDERS
) -> dict[str, int]:
    return seed_cache_root(
        seed=None if seed is None else str(seed),
        cache_root=root,
        triton_cache_dir=str(triton or root / "triton_cache"),
        folders=folders,
    )


@pytest.mark.parametrize("exists", [False, True])
def test_an_empty_or_missing_root_gets_the_whole_seed(tmp_path: Path, exists: bool) -> None:
    source = _seed(tmp_path / "seed")
    root = tmp_path / "volume" / "vllm-cache"
    if exists:
        (root / "triton_cache").mkdir(parents=True)
        (root / "modelinfos").mkdir()
    added = seed(source, root)
    assert added == {"modelinfos": 1, "startup_plan": 1, "triton_cache": 2}
    assert _files(root) == _seeded_files(source)  # the peer-access file and the stale staging stay behind
    assert sorted(p.name for p in root.iterdir()) == list(SEEDED)  # nothing staged left


def test_triton_s_kernels_go_where_the_plan_puts_triton(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = _seed(tmp_path / "seed")
    elsewhere = tmp_path / "triton"
    assert seed(source, tmp_path / "root", triton=elsewhere)["triton_cache"] == 2
    assert _files(elsewhere) == _files(source / "triton_cache")
    assert not (tmp_path / "root" / "triton_cache").exists()
    # Triton's own default folder (no VLLM_CACHE_ROOT): not the worker's to fill; the rest is seeded.
    with caplog.at_level(logging.INFO):
        added = seed_cache_root(seed=str(source), cache_root=tmp_path / "default", triton_cache_dir=None)
    assert "triton_cache" not in added and added["modelinfos"] == 1
    assert "Triton's default" in caplog.text


def test_a_folder_with_anything_in_it_is_left_alone(tmp_path: Path) -> None:
    source = _seed(tmp_path / "seed")
    root = tmp_path / "root"
    (root / "triton_cache" / "own").mkdir(parents=True)
    added = seed(source, root)
    assert added == {"modelinfos": 1, "startup_plan": 1}
    assert [p.name for p in (root / "triton_cache").iterdir()] == ["own"]


def test_no_seed_or_an_empty_one_seeds_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (tmp_path / "empty-seed").mkdir()
    assert seed(None, root) == {}
    assert seed(tmp_path / "not-there", root) == {}
    assert seed(tmp_path / "empty-seed", root) == {}  # an image built without one
    (tmp_path / "empty-folders" / "triton_cache").mkdir(parents=True)
    assert seed(tmp_path / "empty-folders", root) == {}
    assert not root.exists()


def test_a_failed_copy_leaves_no_half_entry_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    source = _seed(tmp_path / "seed")
    root = tmp_path / "root"

    def copy_then_fail(src: str, dst: str, **kwargs: object) -> str:  # a full disk, say, mid-copy
        Path(dst, "3f2a").mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("worker.boot.cache_seed.shutil.copytree", copy_then_fail)
    with caplog.at_level(logging.WARNING):
        added = seed(source, root)
    assert added == {}
    assert all(list((root / name).iterdir()) == [] for name in SEEDED)
    assert sorted(p.name for p in root.iterdir()) == list(SEEDED)  # no staging folder left
    assert "not seeded" in caplog.text and "No space left on device" in caplog.text


def test_an_unreadable_folder_does_not_fail_the_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _seed(tmp_path / "seed")
    real_scandir = os.scandir

    unreadable = tmp_path / "root" / "triton_cache"

    def scandir(path: Any) -> Any:
        if isinstance(path, str | os.PathLike) and Path(path) == unreadable:
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    unreadable.mkdir(parents=True)
    monkeypatch.setattr("worker.boot.cache_seed.os.scandir", scandir)
    assert seed(source, tmp_path / "root") == {"modelinfos": 1, "startup_plan": 1}


def test_two_workers_seeding_one_volume_keep_whole_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other worker's copy of one entry lands while this one copies: each entry stays whole,
    the first to land is kept, and neither worker leaves a staging folder."""
    source = _seed(tmp_path / "seed")
    kernels = tmp_path / "root" / "triton_cache"
    real_copytree = shutil.copytree

    def copy_while_another_lands(*args: object, **kwargs: object) -> object:
        copied = real_copytree(*args, **kwargs)  # type: ignore[arg-type,type-var]
        if kernels.exists() and not (kernels / "3f2a").exists():
            shutil.copytree(source / "triton_cache" / "3f2a", kernels / "3f2a")
            (kernels / "3f2a" / "theirs").write_text("x")
        return copied

    monkeypatch.setattr("worker.boot.cache_seed.shutil.copytree", copy_while_another_lands)
    assert seed(source, tmp_path / "root")["triton_cache"] == 1  # 9c1b; 3f2a was theirs
    assert (kernels / "3f2a" / "theirs").exists()
    assert {k: v for k, v in _files(kernels).items() if not k.endswith("theirs")} == _files(source / "triton_cache")
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == list(SEEDED)


def test_a_file_entry_another_worker_wrote_first_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model-class answer is a file, not a folder: the other worker's copy, landed first, is kept
    (a rename would have replaced it)."""
    source = _seed(tmp_path / "seed")
    answers = tmp_path / "root" / "modelinfos"
    name = "vllm-model_executor-models-llama-LlamaForCausalLM.json"
    real_copytree = shutil.copytree

    def copy_while_another_lands(*args: object, **kwargs: object) -> object:
        copied = real_copytree(*args, **kwargs)  # type: ignore[arg-type,type-var]
        if answers.exists() and not (answers / name).exists():
            (answers / name).write_text("theirs")
        return copied

    monkeypatch.setattr("worker.boot.cache_seed.shutil.copytree", copy_while_another_lands)
    assert "modelinfos" not in seed(source, tmp_path / "root")
    assert (answers / name).read_text() == "theirs"


def test_a_folder_that_links_elsewhere_is_seeded_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's folder a link to another place (a volume mounted so, maybe another file system):
    staged beside the real folder, so each entry still moves into place whole by a rename."""
    source = _seed(tmp_path / "seed")
    real = tmp_path / "elsewhere" / "kernels"
    real.mkdir(parents=True)
    root = tmp_path / "root"
    root.mkdir()
    (root / "triton_cache").symlink_to(real)
    staged_in: list[str | None] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*, dir: str | None = None, prefix: str | None = None) -> str:
        staged_in.append(dir)
        return real_mkdtemp(dir=dir, prefix=prefix)

    monkeypatch.setattr("worker.boot.cache_seed.tempfile.mkdtemp", mkdtemp)
    assert seed(source, root, folders=("triton_cache",))["triton_cache"] == 2
    assert staged_in == [str(real.parent)]
    assert _files(real) == _files(source / "triton_cache")
    assert [p.name for p in real.parent.iterdir()] == ["kernels"]  # no staging left beside it


def test_a_seed_named_with_a_tilde_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    _seed(tmp_path / "seed")
    assert seed("~/seed", tmp_path / "root")["modelinfos"] == 1


def test_the_boot_seeds_the_root_the_engine_will_use_before_the_inspection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare_boot, before vLLM is imported: CACHE_SEED into VLLM_CACHE_ROOT (Triton's kernels into
    the folder the plan gives Triton), before the model-class inspection looks for its answer there."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    source = _seed(tmp_path / "seed")
    root = tmp_path / "vllm-cache"
    env = {"MODEL_NAME": str(model), "VLLM_CACHE_ROOT": str(root), "CACHE_SEED": str(source)}
    plan = build_plan(load_settings(env), mode="serverless")
    for name in plan.environment:
        monkeypatch.setenv(name, "")  # recorded, so that what prepare_boot writes is undone after
    seen: list[tuple[list[str], bool]] = []  # at the inspection's start: what it lacks, Triton's kernels there?
    monkeypatch.setattr(  # its own subprocess is not this test's: what it would inspect is
        modelinfo,
        "start",
        lambda plan: seen.append(
            (modelinfo.missing(["LlamaForCausalLM"], plan.model_info_dir), (root / "triton_cache").exists())
        ),
    )
    prefetch.prepare_boot(plan)
    assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton_cache")
    assert _files(root) == _seeded_files(source)
    # The seeded answer before the inspection starts (nothing left to inspect); the kernels after it.
    assert seen == [([], False)]
