"""The tools' answers to bad input: one typed line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.tools import download, quantize
from worker.tools.bench import cli as bench_cli


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("/nonexistent", "no such directory: /nonexistent"),
        ("tiny:bogus", "no embedded tiny model 'tiny:bogus'; known: tiny:target"),
    ],
)
def test_quantize_names_a_missing_model_and_leaves_nothing_behind(
    model: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        quantize.main(["--model", model, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert named in _error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # no <out>.calibration.json beside the output


def test_quantize_refuses_a_directory_without_a_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        quantize.main(["--model", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "has no config.json" in _error_line(capsys)


def test_download_without_the_hub_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import constants

    # Offline mode: the hub client's own no-network failure (this machine has no route to the hub).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert download.main(["--model", "org/no-such-model", "--dest", str(tmp_path / "models")]) == 1
    line = _error_line(capsys)
    assert line.startswith("error: cannot download org/no-such-model: ") and len(line) < 400


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--concurrency", "abc"], "argument --concurrency: 'abc' is not positive integers separated by commas"),
        (["--ks", "2,x"], "argument --ks: '2,x' is not positive integers"),
        (["--render", "missing.json"], "argument --render: no such file: missing.json"),
    ],
)
def test_bench_names_the_bad_flag(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_cli.main(argv)
    assert exit_info.value.code == 2
    assert named in _error_line(capsys)
