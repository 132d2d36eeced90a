"""The results page's serving table kinds: for each, the Markdown table of a table's runs and the
points a selector reads off one run (:meth:`.results_index.Index.points`), both from the result
files alone (the speculation kinds: :mod:`.results_spec_tables`).

- ``overhead``: ``python -m worker bench --parts overhead`` (the handler against raw ``AsyncLLM``);
- ``compile``: two such files, compile-free (``free``) and compiled (``compiled``), joined by load;
- ``pod``: ``--parts pod`` (the pod against vLLM's server); ``ceiling`` names an ``overhead`` run
  whose raw ``AsyncLLM`` is the engine's own limit at those loads;
- ``coldstart``: ``--parts coldstart`` or ``coldstart_handler`` files, grouped by case.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from worker.tools.bench.results_index import Index, Kind, Point, Run, Table, fmt_point

__all__ = ["SERVING_KINDS", "md_table", "name", "num", "ratio", "wanted"]


def md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def name(run: Run) -> str:
    return run.label or run.id


def wanted(selector: dict[str, Any], c: int) -> bool:
    return "streams" not in selector or c in selector["streams"]


# ------------------------------------------------------------------------------ overhead
def _overhead_rows(index: Index, run: Run) -> list[dict[str, Any]]:
    return sorted(index.load(run.file)["overhead"]["rows"], key=lambda r: int(r["concurrency"]))


def _overhead_render(index: Index, table: Table) -> list[str]:
    rows = []
    for run in table.runs:
        for r in _overhead_rows(index, run):
            h, raw = r["handler"], r["vllm_asyncllm"]
            rows.append(
                [
                    name(run),
                    str(r["concurrency"]),
                    num(h["throughput_tok_s"]),
                    num(raw["throughput_tok_s"]),
                    f"**{ratio(r['throughput_ratio'])}**",
                    f"{num(h['ttft_p50_ms'], 1)} / {num(raw['ttft_p50_ms'], 1)}",
                    f"{num(h['itl_mean_ms'], 2)} / {num(raw['itl_mean_ms'], 2)}",
                ]
            )
    head = ["run", "streams", "the handler, tok/s", "raw `AsyncLLM`, tok/s", "handler / `AsyncLLM`"]
    return md_table([*head, "TTFT p50, ms", "ITL, ms"], rows)


def _overhead_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    measure = selector.get("measure", "ratio")
    points = []
    for r in _overhead_rows(index, run):
        c = int(r["concurrency"])
        if not wanted(selector, c):
            continue
        if measure == "ratio":
            point = Point(str(c), r["throughput_ratio"], "x", 3, c, "streams")
        else:
            path = {"handler_tok_s": "handler", "raw_tok_s": "vllm_asyncllm"}[measure]
            point = Point(str(c), r[path]["throughput_tok_s"], "tok/s", 0, c, "streams")
        points.append(point)
    return points


# ------------------------------------------------------------------------------ compile
def _compile_pairs(index: Index, run: Run) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    free = {int(r["concurrency"]): r["handler"] for r in index.load(run.files["free"][0])["overhead"]["rows"]}
    compiled = {int(r["concurrency"]): r["handler"] for r in index.load(run.files["compiled"][0])["overhead"]["rows"]}
    return [(c, free[c], compiled[c]) for c in sorted(free) if c in compiled]


def _compile_render(index: Index, table: Table) -> list[str]:
    rows = [
        [
            name(run),
            str(c),
            num(free["throughput_tok_s"]),
            num(compiled["throughput_tok_s"]),
            f"**{ratio(free['throughput_tok_s'] / compiled['throughput_tok_s'])}**",
            f"{num(free['itl_mean_ms'], 2)} / {num(compiled['itl_mean_ms'], 2)}",
        ]
        for run in table.runs
        for c, free, compiled in _compile_pairs(index, run)
    ]
    head = ["run", "streams", "compile-free, tok/s", "compiled, tok/s", "compile-free / compiled", "ITL, ms"]
    return md_table(head, rows)


def _compile_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    return [
        Point(str(c), free["throughput_tok_s"] / compiled["throughput_tok_s"], "x", 3, c, "streams")
        for c, free, compiled in _compile_pairs(index, run)
        if wanted(selector, c)
    ]


# ------------------------------------------------------------------------------ pod
def _pod_rows(index: Index, run: Run) -> list[dict[str, Any]]:
    return sorted(index.load(run.file)["pod"]["rows"], key=lambda r: int(r["concurrency"]))


def _pairs(r: dict[str, Any]) -> str:
    runs = r.get("throughput_ratio_runs")
    if not runs or r.get("throughput_ratio_mean") is None:
        return "-"
    return f"{r['throughput_ratio_mean']:.3f} ± {r['throughput_ratio_2se']:.3f} ({min(runs):.2f}-{max(runs):.2f})"


def _pod_render(index: Index, table: Table) -> list[str]:
    ceiling: dict[float, float] = {}
    if "ceiling" in table.options:
        found = index.points({"run": table.options["ceiling"], "measure": "raw_tok_s"})
        ceiling = {p.x: p.value for p in found if p.x is not None}
    rows = []
    for run in table.runs:
        for r in _pod_rows(index, run):
            pod, server = r["pod"], r["vllm_server"]
            row = [
                name(run),
                str(r["concurrency"]),
                num(pod["throughput_tok_s"]),
                num(server["throughput_tok_s"]),
                f"**{ratio(r['throughput_ratio'])}**",
                _pairs(r),
                f"{num(pod['ttft_p50_ms'], 1)} / {num(server['ttft_p50_ms'], 1)}",
                f"{num(pod['itl_mean_ms'], 2)} / {num(server['itl_mean_ms'], 2)}",
            ]
            if ceiling:
                row.append(num(ceiling.get(float(r["concurrency"]))))
            rows.append(row)
    head = ["run", "streams", "the pod, tok/s", "`vllm serve`, tok/s", "pod / server (medians)"]
    head += ["pairs: mean ± 2 SE (range)", "TTFT p50, ms (pod / server)", "ITL, ms (pod / server)"]
    if ceiling:
        head.append("raw `AsyncLLM`, tok/s (the engine's ceiling)")
    return md_table(head, rows)


def _pod_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    measure = selector.get("measure", "ratio")
    points = []
    for r in _pod_rows(index, run):
        c = int(r["concurrency"])
        if not wanted(selector, c):
            continue
        if measure == "ratio":
            points.append(Point(str(c), r["throughput_ratio"], "x", 3, c, "streams"))
        else:
            path = {"pod_tok_s": "pod", "server_tok_s": "vllm_server"}[measure]
            points.append(Point(str(c), r[path]["throughput_tok_s"], "tok/s", 0, c, "streams"))
    return points


# ------------------------------------------------------------------------------ coldstart
def _boot(data: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = data.get("coldstart") or data["coldstart_handler"]
    return found


def _cases(selector: dict[str, Any], run: Run) -> list[str]:
    case = selector.get("case", list(run.files))
    cases = [case] if isinstance(case, str) else list(case)
    unknown = [c for c in cases if c not in run.files]
    if unknown:
        raise ValueError(f"results.json: run {run.id!r} has no case {unknown[0]!r} (it has {', '.join(run.files)})")
    return cases


def _coldstart_points(index: Index, table: Table, run: Run, selector: dict[str, Any]) -> list[Point]:
    measure = selector.get("measure", "handler")
    points = []
    for case in _cases(selector, run):
        for file in run.files[case]:
            boot = _boot(index.load(file))
            handler = boot["handler"]["first_token_s"]
            server = (boot.get("vllm_server") or {}).get("first_token_s")
            value = {"handler": handler, "server": server, "ratio": handler / server if server else None}[measure]
            if value is not None:
                unit, digits = ("x", 3) if measure == "ratio" else ("s", 1)
                points.append(Point(Path(file).stem, value, unit, digits, None, "boot"))
    return points


def _three(points: list[Point]) -> str:
    if not points:
        return "-"
    values = sorted(p.value for p in points)
    shown = [values[0], statistics.median(values), values[-1]] if len(values) > 2 else values
    return " / ".join(fmt_point(Point("", v, points[0].unit, points[0].digits)) for v in shown)


# What ends each phase, as the cold-start bench stamps it (coldstart.py, the boot's log lines).
PHASES = {
    "vllm_import": "main process: vLLM's imports",
    "vllm_config": "main process: vLLM's config",
    "engine_config": "main process: engine config, up to the core's fork",
    "model_load": "engine core start, weights load",
    "kv_cache_profile": "KV cache sizing (profile run)",
    "kernel_warmup": "kernel warm-up",
    "cuda_graph_capture": "CUDA-graph capture",
    "engine_init_done": "engine initialised",
    "worker_warmup": "the worker's warm-up request",
    "engine_ready": "engine ready",
    "first_token": "first token",
}


def _phases(index: Index, files: tuple[str, ...]) -> dict[str, list[float]]:
    durations: dict[str, list[float]] = {}
    for file in files:
        ends = _boot(index.load(file))["handler"].get("phases_end_s") or {}
        before = 0.0
        for phase, end in ends.items():
            durations.setdefault(phase, []).append(end - before)
            before = end
    return durations


def _coldstart_render(index: Index, table: Table) -> list[str]:
    rows = []
    for run in table.runs:
        for case, files in run.files.items():
            select = {"case": case}
            handler = _coldstart_points(index, table, run, {**select, "measure": "handler"})
            server = _coldstart_points(index, table, run, {**select, "measure": "server"})
            ratio = _coldstart_points(index, table, run, {**select, "measure": "ratio"})
            rows.append([case, str(len(files)), f"**{_three(handler)}**", _three(server), _three(ratio)])
    head = [
        "case",
        "boots",
        "the handler: first token (min / median / max)",
        "`vllm serve` beside it",
        "handler / server",
    ]
    lines = md_table(head, rows)
    if table.options.get("phases"):
        run = table.runs[0]
        by_case = {case: _phases(index, files) for case, files in run.files.items()}
        order = list(dict.fromkeys(phase for phases in by_case.values() for phase in phases))
        phase_rows = [
            [PHASES.get(phase, phase)]
            + [num(statistics.median(by_case[case][phase]), 2) if phase in by_case[case] else "-" for case in by_case]
            for phase in order
        ]
        lines += ["", "Where the handler's time goes, phase by phase (medians, s):", ""]
        lines += md_table(["phase", *by_case], phase_rows)
    return lines


SERVING_KINDS: dict[str, Kind] = {
    "overhead": Kind(_overhead_render, _overhead_points),
    "compile": Kind(_compile_render, _compile_points),
    "pod": Kind(_pod_render, _pod_points),
    "coldstart": Kind(_coldstart_render, _coldstart_points),
}
