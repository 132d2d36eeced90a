"""The real-text set and its bench's arithmetic (worker/tools/bench/real_text*.py), without an
engine: the engine runs are tests/test_smollm2.py's and the bench's own."""

from __future__ import annotations

from typing import Any

import pytest

from worker.config import load_settings
from worker.tools.bench import cli
from worker.tools.bench.real_text import cost_key, render_real_text, task_row
from worker.tools.bench.real_text_tasks import KINDS, TASKS


def test_the_set_holds_two_prompts_of_each_kind_under_unique_names() -> None:
    assert sorted(task.kind for task in TASKS) == sorted(KINDS * 2)
    assert len({task.name for task in TASKS}) == len(TASKS)
    # Room for the answer in the embedded models' 1,024 tokens (SmolLM2 reads ~4 characters a token).
    assert all(len(task.prompt) < 1200 and task.max_tokens <= 256 for task in TASKS)


def _answer(task: str, kind: str, histogram: list[int]) -> dict[str, Any]:
    k, steps = len(histogram) - 1, sum(histogram)
    accepted = sum(j * n for j, n in enumerate(histogram))
    spec = {"num_spec_steps": steps, "num_draft_tokens": k * steps, "num_accepted_draft_tokens": accepted}
    return {"task": task, "kind": kind, "spec_decode": {**spec, "acceptance_histogram": histogram}}


def test_a_rows_figures_and_verdicts_come_from_its_counts() -> None:
    row = task_row(_answer("t", "chat", [6, 2, 1, 1]), k=3, threshold=1.5, break_even=1.06)
    assert row["mean_acceptance_length"] == pytest.approx(1.7) and row["accepted_per_step"] == pytest.approx(0.7)
    assert not row["watchdog_low"] and not row["costs_more_than_it_saves"]
    low = task_row(_answer("t", "chat", [8, 2, 0, 0]), k=3, threshold=1.5, break_even=1.06)
    assert low["watchdog_low"] and not low["costs_more_than_it_saves"]  # 1.2: between the two
    costs = task_row(_answer("t", "chat", [19, 1, 0, 0]), k=3, threshold=1.5, break_even=1.06)
    assert costs["watchdog_low"] and costs["costs_more_than_it_saves"]  # 1.05


def test_the_table_pools_each_kinds_counts() -> None:
    histograms = {"extract": [1, 1], "code": [0, 2], "document": [2, 0], "chat": [3, 1], "json": [1, 3]}
    rows = [
        task_row(_answer(task.name, task.kind, histograms[task.kind]), k=1, threshold=1.5, break_even=1.06)
        for task in TASKS
    ]
    answers = [{"task": task.name, "decode_tok_s": None} for task in TASKS]
    table = render_real_text({"baseline": None, "runs": [{"k": 1, "rows": rows, "answers": answers}]})
    assert "| rename-variable (code) | 2.00 / 1.00 |" in table
    assert "| **chat** | 1.25 / 0.25 |" in table and "| **json** | 1.75 / 0.75 |" in table


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({}, "ngram"),
        ({"MODEL_NAME": "m", "SPECULATIVE_METHOD": "eagle3", "SPECULATIVE_MODEL": "h"}, "eagle"),
        ({"MODEL_NAME": "m", "SPECULATIVE_MODEL": "m"}, "draft_model"),
    ],
)
def test_each_drafter_is_priced_by_its_own_step_costs(env: dict[str, str], key: str) -> None:
    assert cost_key(load_settings(env)) == key


def test_the_flag_is_in_the_benchs_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    usage = capsys.readouterr().out
    assert "--real-text" in usage and "--skip-baseline" in usage
