"""The results page's speculation table kinds (the serving ones and the helpers they share:
:mod:`.results_tables`).

- ``spec_map``: a ``spec_map.json`` (:mod:`.spec_map`), each configuration against the map's own
  engine without speculation (or, for a selector's ``against``, another of its configurations);
- ``real_text``: ``--real-text`` files, by role, one column per (role, k);
- ``stats_vs_stock``: a map's exact-stats configuration against its ``stock`` twin (vLLM's scheduler);
- ``lossless``: ``--parts lossless``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from worker.tools.bench.results_index import Index, Kind, Point, Run, Table
from worker.tools.bench.results_tables import md_table, name, num, ratio, wanted
from worker.tools.bench.spec_map_config import baseline

__all__ = ["SPEC_KINDS", "config_label"]


# ------------------------------------------------------------------------------ spec_map
def config_label(config: str, drafters: dict[str, str]) -> str:
    """A map's configuration (``DRAFTER:K:LENGTH:CONTROL[+KEY=VALUE...]``, :mod:`.spec_map`) in words."""
    name, *extra = config.split("+")
    if name == "none":
        text = "no speculation"
    else:
        drafter, k, length, control = name.rsplit(":", 3)
        who = drafters.get(Path(drafter).name, drafter)
        how = {
            "auto": f"`auto` (k ≤ {k})",
            "static": f"static k = {k}",
            "stock": f"static k = {k}, vLLM's scheduler (exact stats off)",
        }[control]
        accepted = "real acceptance" if length == "real" else "0% accepted" if float(length) == 1 else f"L = {length}"
        text = f"{who}, {how}, {accepted}"
    return text + (f" (`{' '.join(extra)}`)" if extra else "")


def _map(index: Index, run: Run) -> tuple[dict[str, Any], str]:
    data = index.load(run.file)
    base = baseline(data["configs"])
    if base is None:
        raise ValueError(f"{run.file}: a map without a configuration that does not speculate")
    return data, base


def _map_rows(index: Index, run: Run) -> list[str]:
    data, base = _map(index, run)
    return list(run.options.get("rows") or [c for c in data["configs"] if c != base])


def _tok_s(data: dict[str, Any], config: str, c: int) -> float | None:
    row = data["table"].get(config, {}).get(str(c))
    return None if not row else row.get("throughput_tok_s")


def _vs_none(data: dict[str, Any], base: str, config: str, c: int) -> float | None:
    mine, none = _tok_s(data, config, c), _tok_s(data, base, c)
    return mine / none if mine and none else None


def _map_render(index: Index, table: Table) -> list[str]:
    streams = sorted({int(c) for run in table.runs for c in index.load(run.file)["concurrencies"]})
    baselines, rows = [], []
    for run in table.runs:
        data, base = _map(index, run)
        baselines.append([f"{config_label(base, index.drafters)}, tok/s", name(run)])
        baselines[-1] += [num(_tok_s(data, base, c)) for c in streams]
        for config in _map_rows(index, run):
            label = run.options.get("labels", {}).get(config) or config_label(config, index.drafters)
            rows.append([label, name(run), *(ratio(_vs_none(data, base, config, c), 2) for c in streams)])
    heads = [f"{c} stream" if c == 1 else f"{c} streams" for c in streams]
    return md_table(["configuration", "map", *heads], baselines + rows)


def _map_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    data, base = _map(index, run)
    config = selector["row"]
    if config not in data["configs"]:
        raise ValueError(f"{run.file}: no configuration {config!r} (it has {', '.join(data['configs'])})")
    against = selector.get("against", base)  # another configuration of the map: the ratio to it
    points = []
    for c in sorted(int(c) for c in data["concurrencies"]):
        value = _tok_s(data, config, c) if selector.get("measure") == "tok_s" else _vs_none(data, against, config, c)
        if value is not None and wanted(selector, c):
            unit = "tok/s" if selector.get("measure") == "tok_s" else "x"
            points.append(Point(str(c), value, unit, 2, c, "streams"))
    return points


# ------------------------------------------------------------------------------ real_text
def _real_text_cells(index: Index, table: Table, run: Run) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """The baseline's tok/s by task and, per column, each task's ``L`` and speed against it."""
    columns = table.options["columns"]
    base_file = run.files[table.options.get("baseline", columns[0]["role"])][0]
    base = {a["task"]: a["decode_tok_s"] for a in index.load(base_file)["baseline"]["answers"]}
    cells = []
    for column in columns:
        data = index.load(run.files[column["role"]][0])
        spec = next(r for r in data["runs"] if r["k"] == column["k"])
        speeds = {a["task"]: a["decode_tok_s"] for a in spec["answers"]}
        cells.append(
            {
                "label": column["label"],
                "rows": {
                    r["task"]: (r["kind"], r["mean_acceptance_length"], speeds[r["task"]] / base[r["task"]])
                    for r in spec["rows"]
                },
            }
        )
    return base, cells


def _real_text_render(index: Index, table: Table) -> list[str]:
    rows = []
    for run in table.runs:
        base, cells = _real_text_cells(index, table, run)
        for task in base:
            kind = cells[0]["rows"][task][0]
            row = [f"{task} ({kind})", num(base[task])]
            row += [f"{cell['rows'][task][1]:.2f} ({cell['rows'][task][2]:.2f}x)" for cell in cells]
            rows.append(row)
    labels = [column["label"] for column in table.options["columns"]]
    return md_table(["task (kind)", "none, tok/s", *labels], rows)


def _real_text_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    _, cells = _real_text_cells(index, table, run)
    cell = next(c for c in cells if c["label"] == selector["column"])
    i, unit = (1, "") if selector.get("measure", "L") == "L" else (2, "x")
    return [Point(task, values[i], unit, 2, None, "task") for task, values in cell["rows"].items()]


# ------------------------------------------------------------------------------ stats_vs_stock
def _stock_rows(index: Index, run: Run) -> list[tuple[int, float, float]]:
    data = index.load(run.file)
    exact, stock = run.options["exact"], run.options["stock"]
    rows = []
    for c in sorted(int(c) for c in data["concurrencies"]):
        mine, theirs = _tok_s(data, exact, c), _tok_s(data, stock, c)
        if mine and theirs:
            rows.append((c, mine, theirs))
    return rows


def _stock_render(index: Index, table: Table) -> list[str]:
    rows = [
        [name(run), str(c), num(mine), num(theirs), f"**{ratio(mine / theirs)}**"]
        for run in table.runs
        for c, mine, theirs in _stock_rows(index, run)
    ]
    head = ["run", "streams", "with the exact stats, tok/s", "vLLM's scheduler, stats off, tok/s", "ratio"]
    return md_table(head, rows)


def _stock_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    return [
        Point(str(c), mine / theirs, "x", 3, c, "streams")
        for c, mine, theirs in _stock_rows(index, run)
        if wanted(selector, c)
    ]


# ------------------------------------------------------------------------------ lossless
def _sampling(block: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value:g}" for key, value in block["sampling"].items())


def _informative(block: dict[str, Any]) -> bool:
    return bool(max(block["thresholds"]) > 0)  # all 0: the model puts all its mass on one token


def _lossless_render(index: Index, table: Table) -> list[str]:
    rows = []
    for run in table.runs:
        for block in index.load(run.file)["lossless"]:
            thresholds = f"{min(block['thresholds']):.3f}-{max(block['thresholds']):.3f}"
            control = block["control"]
            for engine, row, verdict in [("A/A control", control, "passes" if control["passes"] else "fails")] + [
                (r["config"], r, "lossless" if r["lossless"] else "lossy") for r in block["rows"]
            ]:
                shown = verdict if _informative(block) else "uninformative: all mass on one token"
                over = ", ".join(str(p) for p in row["positions_over_threshold"]) or "none"
                low = f"{row['low_logprob_share'] * 100:.1f}%"
                rows.append([_sampling(block), engine, f"{row['max_tv']:.3f}", thresholds, over, low, f"**{shown}**"])
    head = ["sampling", "engine", "max TV distance", "A/A thresholds", "positions over"]
    return md_table([*head, "tokens below log-prob -6", "verdict"], rows)


def _lossless_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    return [
        Point(f"{r['config']} at {_sampling(block)}", 1.0 if r["lossless"] else 0.0, "", 0, None, "engine")
        for block in index.load(run.file)["lossless"]
        if _informative(block)
        for r in block["rows"]
    ]


SPEC_KINDS: dict[str, Kind] = {
    "spec_map": Kind(_map_render, _map_points),
    "real_text": Kind(_real_text_render, _real_text_points),
    "stats_vs_stock": Kind(_stock_render, _stock_points),
    "lossless": Kind(_lossless_render, _lossless_points),
}
