"""TRITON_CACHE_SEED: an empty Triton kernel cache starts from the image's seed, whole or not at all;
a cache with anything in it, a seed that is not there and a copy that fails leave it as it was."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from worker.boot import modelinfo, prefetch
from worker.boot.kernel_cache import seed_triton_cache, triton_cache_dir
from worker.boot.plan import build_plan
from worker.config import load_settings


def _seed(directory: Path) -> Path:
    """A cache as Triton lays one out: a folder per kernel hash, its files and a group file."""
    for key in ("3f2a", "9c1b"):
        kernel = directory / key
        kernel.mkdir(parents=True)
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
    assert seed_triton_cache(str(seed), str(cache)) == 4
    assert _files(cache) == _files(seed)
    assert sorted(p.name for p in cache.parent.iterdir()) == ["triton_cache"]  # no staging folder left


def test_a_cache_with_anything_in_it_is_left_alone(tmp_path: Path) -> None:
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "cache"
    (cache / "own").mkdir(parents=True)
    assert seed_triton_cache(str(seed), str(cache)) == 0
    assert [p.name for p in cache.iterdir()] == ["own"]


def test_no_seed_seeds_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert seed_triton_cache(None, str(cache)) == 0
    assert seed_triton_cache(str(tmp_path / "not-there"), str(cache)) == 0  # the image built without one
    assert not cache.exists()


def test_a_failed_copy_leaves_no_half_seed_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "cache"

    def copy_then_fail(src: str, dst: str, **kwargs: object) -> str:  # a full disk, say, after one file
        os.makedirs(dst)
        Path(dst, "3f2a").mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("worker.boot.kernel_cache.shutil.copytree", copy_then_fail)
    with caplog.at_level(logging.WARNING):
        assert seed_triton_cache(str(seed), str(cache)) == 0
    assert not cache.exists() and list(tmp_path.iterdir()) == [seed]
    assert "not seeded" in caplog.text and "No space left on device" in caplog.text


def test_a_cache_another_worker_filled_meanwhile_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _seed(tmp_path / "seed")
    cache = tmp_path / "cache"
    cache.mkdir()
    real_copytree = shutil.copytree

    def copy_while_another_fills(*args: object, **kwargs: object) -> object:
        if not (cache / "theirs").exists():
            (cache / "theirs").write_text("x")  # the other worker's seed lands while this one copies
        return real_copytree(*args, **kwargs)  # type: ignore[arg-type,type-var]

    monkeypatch.setattr("worker.boot.kernel_cache.shutil.copytree", copy_while_another_fills)
    assert seed_triton_cache(str(seed), str(cache)) == 0
    assert [p.name for p in cache.iterdir()] == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "seed"]


def test_tritons_cache_folder_is_the_one_triton_reads() -> None:
    assert triton_cache_dir({"TRITON_CACHE_DIR": "/v/triton_cache"}) == "/v/triton_cache"
    assert triton_cache_dir({"TRITON_HOME": "/home/t"}) == "/home/t/.triton/cache"
    assert triton_cache_dir({}) == os.path.join(os.path.expanduser("~"), ".triton", "cache")


def test_the_boot_seeds_the_cache_the_engine_will_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare_boot, before vLLM is imported: TRITON_CACHE_SEED into VLLM_CACHE_ROOT/triton_cache."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    seed = _seed(tmp_path / "seed")
    root = tmp_path / "vllm-cache"
    env = {"MODEL_NAME": str(model), "VLLM_CACHE_ROOT": str(root), "TRITON_CACHE_SEED": str(seed)}
    plan = build_plan(load_settings(env), mode="serverless")
    for name in plan.environment:
        monkeypatch.delenv(name, raising=False)  # prepare_boot writes the plan's environment: undone after
    monkeypatch.setattr(modelinfo, "start", lambda plan: None)  # its own subprocess: not this test's
    prefetch.prepare_boot(plan)
    assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton_cache")
    assert _files(root / "triton_cache") == _files(seed)
