"""The results page's index, ``docs/gpu-results/results.json``: which result files each section of
``docs/benchmarks.md`` renders, what each run was (card, vLLM, date, command), the goals read off
them, the plots and the README's headline rows. Loaded and checked once (a file's own ``gpu`` and
``vllm_version``, where it records them, must agree with what the index says of its run); the
tables, goals and plots then ask it for points through selectors.

A selector names a run (``"run": id``) or every run of a table (``"table": id``) and what to read
off it (the keys each table kind takes: ``streams``, ``row``, ``case``, ``measure``, ...); a goal or
a headline row without one (no ``of``) is not measured yet. Every run is on the image's vLLM
(``image_vllm``): the index refuses a run on another, whose figures belong in the history
(``docs/gpu-results/HISTORY.md``) until a run on the image's vLLM replaces them.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Index", "Kind", "Point", "Run", "Section", "Table", "fmt_point", "load_index", "spread"]


@dataclass(frozen=True)
class Point:
    """One figure read off a run: ``label`` says where (``"64"`` with ``axis`` ``"streams"``, a boot's
    name), ``x`` places it on a plot's axis (None: no numeric place)."""

    label: str
    value: float
    unit: str  # "x" (a ratio), "s", "tok/s", "%" or "" (a plain number)
    digits: int = 2
    x: float | None = None
    axis: str = ""


def fmt_point(point: Point, *, digits: int | None = None) -> str:
    d = point.digits if digits is None else digits
    if point.unit == "tok/s":
        return f"{point.value:,.0f} tok/s"
    if point.unit == "s":
        return f"{point.value:.{d}f} s"
    if point.unit == "%":
        return f"{point.value:.{d}f}%"
    return f"{point.value:.{d}f}{point.unit}"


@dataclass(frozen=True)
class Run:
    """One run's files (by role: ``""`` for a run of one file) and what it was."""

    id: str
    label: str
    files: dict[str, tuple[str, ...]]
    card: str
    vllm: str
    date: str
    command: str
    code: str | None
    options: dict[str, Any]

    @property
    def file(self) -> str:
        return self.files[""][0]

    def describe(self) -> str:
        code = f", code {self.code}" if self.code else ""
        return f"{self.card}, vLLM {self.vllm}, {self.date}{code}"


@dataclass(frozen=True)
class Table:
    id: str
    kind: str
    title: str
    runs: tuple[Run, ...]
    options: dict[str, Any]
    note: str = ""


@dataclass(frozen=True)
class Section:
    title: str
    question: str
    goals: tuple[dict[str, Any], ...]
    tables: tuple[Table, ...]
    plots: tuple[dict[str, Any], ...]
    pending: tuple[dict[str, str], ...]
    note: str = ""


@dataclass(frozen=True)
class Kind:
    """A table kind: its Markdown table of a table's runs, and the points a selector reads off a run."""

    render: Callable[[Index, Table], list[str]]
    points: Callable[[Index, Table, Run, dict[str, Any]], list[Point]]


@dataclass
class Index:
    root: Path  # the results folder, docs/gpu-results
    kinds: dict[str, Kind]
    image_vllm: str
    intro: str
    drafters: dict[str, str]
    sections: tuple[Section, ...]
    readme: tuple[dict[str, Any], ...]
    _cache: dict[str, Any] = field(default_factory=dict)

    def load(self, path: str) -> Any:
        if path not in self._cache:
            self._cache[path] = json.loads((self.root / path).read_text())
        return self._cache[path]

    def tables(self) -> list[Table]:
        return [table for section in self.sections for table in section.tables]

    def run(self, run_id: str) -> tuple[Table, Run]:
        for table in self.tables():
            for run in table.runs:
                if run.id == run_id:
                    return table, run
        raise ValueError(f"results.json: no run {run_id!r}")

    def table(self, table_id: str) -> Table:
        for table in self.tables():
            if table.id == table_id:
                return table
        raise ValueError(f"results.json: no table {table_id!r}")

    def cited(self) -> set[str]:
        """Every file the index names, relative to the results folder."""
        files = {
            path for table in self.tables() for run in table.runs for paths in run.files.values() for path in paths
        }
        return files | {plot["file"] for section in self.sections for plot in section.plots}

    def points(self, selector: dict[str, Any]) -> list[Point]:
        """The points ``selector`` names: of its run, or of every run of its table."""
        if "run" in selector:
            table, run = self.run(selector["run"])
            runs = [run]
        else:
            table = self.table(selector["table"])
            runs = list(table.runs)
        kind = self.kinds[table.kind]
        return [point for run in runs for point in kind.points(self, table, run, selector)]


def _run(entry: dict[str, Any]) -> Run:
    known = {"id", "label", "file", "files", "card", "vllm", "date", "command", "code"}
    files: dict[str, tuple[str, ...]]
    if "file" in entry:
        files = {"": (str(entry["file"]),)}
    else:
        files = {role: tuple(paths) if isinstance(paths, list) else (paths,) for role, paths in entry["files"].items()}
    return Run(
        id=entry["id"],
        label=entry.get("label", ""),
        files=files,
        card=entry["card"],
        vllm=entry["vllm"],
        date=entry["date"],
        command=entry["command"],
        code=entry.get("code"),
        options={key: value for key, value in entry.items() if key not in known},
    )


def _table(entry: dict[str, Any]) -> Table:
    known = {"id", "kind", "title", "runs", "note"}
    return Table(
        id=entry["id"],
        kind=entry["kind"],
        title=entry["title"],
        runs=tuple(_run(run) for run in entry["runs"]),
        options={key: value for key, value in entry.items() if key not in known},
        note=entry.get("note", ""),
    )


def load_index(path: Path, *, kinds: dict[str, Kind]) -> Index:
    """The index at ``path``, its tables drawn by ``kinds``, checked: unique ids, known table kinds,
    every run on the image's vLLM, every file present, and each file's own card and vLLM (where it
    records them) those the index gives its run. Raises ValueError naming the first thing that
    disagrees."""
    raw = json.loads(path.read_text())
    index = Index(
        root=path.parent,
        kinds=kinds,
        image_vllm=raw["image_vllm"],
        intro=raw["intro"],
        drafters=raw.get("drafters", {}),
        sections=tuple(
            Section(
                title=section["title"],
                question=section["question"],
                goals=tuple(section.get("goals", [])),
                tables=tuple(_table(table) for table in section.get("tables", [])),
                plots=tuple(section.get("plots", [])),
                pending=tuple(section.get("pending", [])),
                note=section.get("note", ""),
            )
            for section in raw["sections"]
        ),
        readme=tuple(raw.get("readme", [])),
    )
    ids = [run.id for table in index.tables() for run in table.runs] + [table.id for table in index.tables()]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"results.json: ids used twice: {', '.join(repeated)}")
    for table in index.tables():
        if table.kind not in kinds:
            raise ValueError(f"results.json: table {table.id!r} has no kind {table.kind!r} (known: {', '.join(kinds)})")
        for run in table.runs:
            if run.vllm != index.image_vllm:
                raise ValueError(
                    f"results.json: run {run.id!r} is on vLLM {run.vllm}, not the image's {index.image_vllm}: "
                    "re-measure it, or move it to HISTORY.md"
                )
            for paths in run.files.values():
                for file in paths:
                    _check_file(index, run, file)
    return index


def _check_file(index: Index, run: Run, file: str) -> None:
    if not (index.root / file).is_file():
        raise ValueError(f"results.json: run {run.id!r} names {file}, which is not there")
    data = index.load(file)
    if not isinstance(data, dict):
        return
    recorded = data.get("vllm_version")
    if recorded is not None and recorded != run.vllm:
        raise ValueError(f"{file}: vLLM {recorded}, but results.json says {run.vllm} for run {run.id!r}")
    gpu = data.get("gpu")
    if gpu is not None and run.card not in gpu:
        raise ValueError(f"{file}: measured on {gpu}, but results.json says {run.card} for run {run.id!r}")


def spread(points: list[Point]) -> str:
    """The points' values as ``min-max`` (one value alone as itself), then where: the streams they
    span, or the median and how many (boots, tasks)."""
    if not points:
        return "-"
    unit, digits, axis = points[0].unit, points[0].digits, points[0].axis
    values = sorted(p.value for p in points)
    low, high = (fmt_point(Point("", v, unit, digits)) for v in (values[0], values[-1]))
    text = low if low == high else f"{low.removesuffix(unit).strip()}-{high}"
    xs = sorted({p.x for p in points if p.x is not None})
    if axis == "streams" and xs:
        text += f" at {xs[0]:g}" + (f"-{xs[-1]:g} streams" if len(xs) > 1 else " stream" if xs[0] == 1 else " streams")
    elif len(values) > 2:
        median = fmt_point(Point("", statistics.median(values), unit, digits))
        text += f" (median {median}, {len(values)} {axis}s)"
    elif axis:
        text += f" ({len(values)} {axis}{'s' if len(values) > 1 else ''})"
    return text
