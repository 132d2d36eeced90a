"""TRITON_CACHE_SEED: an empty Triton kernel cache starts from the image's seed, each entry whole; a
cache with anything in it, a seed that is empty or not there, and a copy that fails leave it as it
was, and never fail the boot."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from worker.boot import modelinfo, prefetch
from worker.boot.kernel_cache import seed_triton_cache
from worker.boot.plan import build_plan
from worker.config import load_settings


def _seed(directory: Path, keys: tuple[str, ...] = ("3f2a", "9c1b")) -> Path:
    """A cache as Triton lays one out: a folder per kernel hash, its files and a group file."""
    directory.mkdir(parents=True, exist_ok=True)
    for key in keys:
        kernel = directory / key
        kernel.mkdir()
        (kernel / "kernel.cubin").write_bytes(os.urandom(64))
        (kernel / f"__grp__{key}.json").write_text('{"child_paths": {}}')
    return directory


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize("exists", [False, True])
def test_an_empty_or_missing_cache_gets_the_whole_seed(tmp_path: Path, exists: bool) -> None:
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "volume" / "vllm-cache" / "triton_cache"
    if exists:
        cache.mkdir(parents=True)
    assert seed_triton_cache(seed=str(seed), cache_dir=str(cache)) == 2
    assert _files(cache) == _files(seed)
    assert [p.name for p in cache.parent.iterdir()] == ["triton_cache"]  # no staging folder left


def test_a_cache_with_anything_in_it_is_left_alone(tmp_path: Path) -> None:
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "cache"
    (cache / "own").mkdir(parents=True)
    assert seed_triton_cache(seed=str(seed), cache_dir=str(cache)) == 0
    assert [p.name for p in cache.iterdir()] == ["own"]


def test_no_seed_or_no_named_folder_seeds_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "empty-seed").mkdir()
    assert seed_triton_cache(seed=None, cache_dir=str(cache)) == 0
    assert seed_triton_cache(seed=str(tmp_path / "not-there"), cache_dir=str(cache)) == 0
    assert seed_triton_cache(seed=str(tmp_path / "empty-seed"), cache_dir=str(cache)) == 0  # an image without one
    assert not cache.exists()
    with caplog.at_level(logging.INFO):
        assert seed_triton_cache(seed=str(_seed(tmp_path / "seed")), cache_dir=None) == 0
    assert "Triton's default" in caplog.text


def test_a_failed_copy_leaves_no_half_entry_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "cache"

    def copy_then_fail(src: str, dst: str, **kwargs: object) -> str:  # a full disk, say, mid-copy
        Path(dst, "3f2a").mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("worker.boot.kernel_cache.shutil.copytree", copy_then_fail)
    with caplog.at_level(logging.WARNING):
        assert seed_triton_cache(seed=str(seed), cache_dir=str(cache)) == 0
    assert list(cache.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cache", "seed"]
    assert "not seeded" in caplog.text and "No space left on device" in caplog.text


def test_an_unreadable_cache_folder_does_not_fail_the_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _seed(tmp_path / "seed")
    real_scandir = os.scandir

    def scandir(path: str) -> Any:
        if str(path).endswith("cache"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    (tmp_path / "cache").mkdir()
    monkeypatch.setattr("worker.boot.kernel_cache.os.scandir", scandir)
    assert seed_triton_cache(seed=str(seed), cache_dir=str(tmp_path / "cache")) == 0


def test_two_workers_seeding_one_volume_keep_whole_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other worker's copy of one entry lands while this one copies: each entry stays whole,
    the first to land is kept, and neither worker leaves a staging folder."""
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "cache"
    real_copytree = shutil.copytree

    def copy_while_another_lands(*args: object, **kwargs: object) -> object:
        copied = real_copytree(*args, **kwargs)  # type: ignore[arg-type,type-var]
        if not (cache / "3f2a").exists():
            shutil.copytree(seed / "3f2a", cache / "3f2a")
            (cache / "3f2a" / "theirs").write_text("x")
        return copied

    monkeypatch.setattr("worker.boot.kernel_cache.shutil.copytree", copy_while_another_lands)
    assert seed_triton_cache(seed=str(seed), cache_dir=str(cache)) == 1  # 9c1b; 3f2a was theirs
    assert (cache / "3f2a" / "theirs").exists()
    assert {k: v for k, v in _files(cache).items() if not k.endswith("theirs")} == _files(seed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "seed"]


def test_the_boot_seeds_the_cache_the_engine_will_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare_boot, before vLLM is imported: TRITON_CACHE_SEED into VLLM_CACHE_ROOT/triton_cache,
    the folder the plan gives Triton."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    seed = _seed(tmp_path / "seed")
    root = tmp_path / "vllm-cache"
    env = {"MODEL_NAME": str(model), "VLLM_CACHE_ROOT": str(root), "TRITON_CACHE_SEED": str(seed)}
    plan = build_plan(load_settings(env), mode="serverless")
    for name in plan.environment:
        monkeypatch.setenv(name, "")  # recorded, so that what prepare_boot writes is undone after
    monkeypatch.setattr(modelinfo, "start", lambda plan: None)  # its own subprocess: not this test's
    prefetch.prepare_boot(plan)
    assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton_cache")
    assert _files(root / "triton_cache") == _files(seed)
