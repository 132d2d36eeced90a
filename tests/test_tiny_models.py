"""The embedded tiny models' build: what a first run says before its half-minute build."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from worker import tiny_models
from worker.tiny_models import cache


def test_a_first_build_says_so_before_it_starts_and_a_built_one_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    said_before: list[bool] = []

    def stand_in_build(root: Path, *, num_steps: int) -> None:  # the real one trains for ~35 s
        said_before.append("building the embedded tiny model (about 35 s, once)" in caplog.text)
        root.mkdir(parents=True)
        (root / "BUILD.json").write_text("{}")

    monkeypatch.setattr(cache, "build_text_models", stand_in_build)
    with caplog.at_level(logging.INFO, logger="worker.tiny_models"):
        tiny_models.ensure_tiny_models(tmp_path)
        assert said_before == [True]
        caplog.clear()
        tiny_models.ensure_tiny_models(tmp_path)
    assert said_before == [True] and "building" not in caplog.text
