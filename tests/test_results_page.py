"""The results page (``docs/benchmarks.md``), its plots and the README's headline table are what the
result files give (``python -m worker bench --render-page``, :mod:`worker.tools.bench.results_page`),
and ``docs/gpu-results/`` holds only what the page cites; the renderer takes runs on the image's vLLM
alone and fails on an index that disagrees with its files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from worker.tools.bench import results_page
from worker.tools.bench.results_index import load_index
from worker.tools.bench.results_page import KINDS, differences, render, verdict


def test_the_page_the_readme_and_the_plots_are_what_the_files_give() -> None:
    assert differences(ROOT) == [], "run `python -m worker bench --render-page` (or fix results.json)"


def test_the_results_tree_keeps_results_only() -> None:
    """JSON the page cites, its plots, the index and the history: no logs, scripts, stamps or notes."""
    results = ROOT / "docs" / "gpu-results"
    kept = {p.relative_to(results).as_posix() for p in results.rglob("*") if p.is_file()}
    assert {"results.json", "HISTORY.md"} <= kept
    others = sorted(p for p in kept - {"results.json", "HISTORY.md"} if Path(p).suffix not in (".json", ".svg"))
    assert others == []


def _spec_map(tok_s: dict[str, dict[int, float]]) -> dict[str, Any]:
    return {
        "configs": list(tok_s),
        "concurrencies": sorted({c for by_c in tok_s.values() for c in by_c}),
        "table": {name: {str(c): {"throughput_tok_s": v} for c, v in by_c.items()} for name, by_c in tok_s.items()},
    }


def _root(tmp_path: Path, *, runs: list[tuple[str, str, dict[str, Any]]], extra: dict[str, Any] | None = None) -> Path:
    """A repository of one section, a map table per vLLM version, and a goal and README row on the
    first run's ``/d:3:2.5:auto``."""
    results = tmp_path / "docs" / "gpu-results"
    results.mkdir(parents=True)
    tables = []
    for i, (run_id, vllm, data) in enumerate(runs):
        (results / f"{run_id}.json").write_text(json.dumps(data))
        entry = {"id": run_id, "file": f"{run_id}.json", "card": "H100", "vllm": vllm, "date": "2026-12-08"}
        tables.append({"id": f"t{i}", "kind": "spec_map", "title": vllm, "runs": [{**entry, "command": "c"}]})
    selector = {"run": runs[0][0], "row": "/d:3:2.5:auto"}
    index = {
        "image_vllm": "0.34.0",
        "intro": "intro",
        "drafters": {"d": "a draft"},
        "sections": [
            {
                "title": "Where speculation pays",
                "question": "q",
                "goals": [{"text": "at least 1.4x", "at_least": 1.4, "of": selector}],
                "tables": tables,
            }
        ],
        "readme": [{"what": "a draft", "set": "", "section": "Where speculation pays", "of": selector}],
        **(extra or {}),
    }
    (results / "results.json").write_text(json.dumps(index))
    (tmp_path / "README.md").write_text(f"{results_page.README_START}\n{results_page.README_END}\n")
    return tmp_path


def test_a_goal_names_the_points_that_miss_it(tmp_path: Path) -> None:
    data = _spec_map({"none": {1: 100.0, 256: 1000.0}, "/d:3:2.5:auto": {1: 163.0, 256: 840.0}})
    root = _root(tmp_path, runs=[("m", "0.34.0", data)])
    index = load_index(root / "docs" / "gpu-results" / "results.json", kinds=KINDS)
    assert verdict(index, index.sections[0].goals[0]) == "**missed**: 0.84x at 256 streams (1 of 2 within)"
    rendered = render(root)
    assert "| a draft, `auto` (k ≤ 3), L = 2.5 | m | 1.63x | 0.84x |" in rendered.page
    assert "1.63x / 0.84x at 1 / 256 streams" in rendered.readme_table
    assert set(rendered.plots) == set()


def test_a_run_on_another_vllm_is_refused_naming_it(tmp_path: Path) -> None:
    data = _spec_map({"none": {1: 100.0}, "/d:3:2.5:auto": {1: 200.0}})
    root = _root(tmp_path, runs=[("m", "0.34.0", data), ("old", "0.32.0", data)])
    with pytest.raises(ValueError, match=r"run 'old' is on vLLM 0\.32\.0, not the image's 0\.34\.0"):
        render(root)
    assert results_page.main(check=True, root=root) == 2


def test_a_goal_and_a_readme_row_without_a_selector_are_not_yet_measured(tmp_path: Path) -> None:
    data = _spec_map({"none": {1: 100.0}, "/d:3:2.5:auto": {1: 200.0}})
    root = _root(tmp_path, runs=[("m", "0.34.0", data)])
    index_path = root / "docs" / "gpu-results" / "results.json"
    index = json.loads(index_path.read_text())
    index["sections"][0]["goals"].append({"text": "n-gram at least 0.98x", "at_least": 0.98})
    index["readme"].append({"what": "n-gram", "set": "`X=1`", "section": "Where speculation pays"})
    index_path.write_text(json.dumps(index))
    rendered = render(root)
    assert "- at least 1.4x: **met**: 2.00x at 1 stream" in rendered.page
    assert "- n-gram at least 0.98x: not yet measured on vLLM 0.34.0" in rendered.page
    link = "[Where speculation pays](docs/benchmarks.md#where-speculation-pays)"
    assert f"| n-gram | `X=1` | not yet measured on vLLM 0.34.0 | {link} |" in rendered.readme_table


def test_an_index_that_disagrees_with_its_file_fails_naming_it(tmp_path: Path) -> None:
    data = {**_spec_map({"none": {1: 100.0}, "/d:3:2.5:auto": {1: 200.0}}), "vllm_version": "0.32.0"}
    root = _root(tmp_path, runs=[("m", "0.34.0", data)])
    with pytest.raises(ValueError, match=r"m\.json: vLLM 0\.32\.0, but results\.json says 0\.34\.0"):
        render(root)


def test_a_stray_file_and_a_stale_page_are_differences(tmp_path: Path) -> None:
    data = _spec_map({"none": {1: 100.0}, "/d:3:2.5:auto": {1: 200.0}})
    root = _root(tmp_path, runs=[("m", "0.34.0", data)])
    (root / "docs" / "gpu-results" / "run.log").write_text("a log")
    assert differences(root) == [
        "docs/benchmarks.md differs from what the result files give",
        "README.md differs from what the result files give",
        "docs/gpu-results/run.log is not cited by results.json",
    ]
    assert results_page.main(check=False, root=root) == 0
    assert differences(root) == ["docs/gpu-results/run.log is not cited by results.json"]


def test_a_command_nothing_runs_any_more_keeps_its_own_code_span(tmp_path: Path) -> None:
    data = _spec_map({"none": {1: 100.0}, "/d:3:2.5:auto": {1: 200.0}})
    root = _root(tmp_path, runs=[("m", "0.34.0", data)])
    index_path = root / "docs" / "gpu-results" / "results.json"
    index = json.loads(index_path.read_text())
    removed = "`X=1 scripts/old.sh stage` (the removed old.sh, at commit abc1234)"
    index["sections"][0]["tables"][0]["runs"][0]["command"] = removed
    index["sections"][0]["pending"] = [{"what": "more", "command": "python -m worker bench --stage s"}]
    index_path.write_text(json.dumps(index))
    page = render(root).page
    assert f"Reproduce: {removed}\n" in page
    assert "| more | `python -m worker bench --stage s` |" in page
