"""Markdown and plots from a run's JSON (nothing typed by hand), and tables from saved runs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.tools.bench.coldstart import boot_phases, parse_boot_log
from worker.tools.bench.servers import pod_table, pool_pod_runs
from worker.tools.bench.tables import (
    boot_columns,
    boot_runs,
    fmt,
    overhead_section,
    phase_table,
    pod_section,
    stats_path_section,
)
from worker.tools.bench.tables_boot import (
    boot_phases_section,
    coldstart_handler_section,
    coldstart_section,
    first_request_section,
    lossless_section,
    roofline_section,
    spec_section,
)

__all__ = ["phase_table", "render_markdown", "render_saved", "write_report"]

# The report's sections, in order: one renderer per part (a part the run skipped renders nothing).
SECTIONS: list[Callable[[dict[str, Any]], list[str]]] = [
    overhead_section,
    stats_path_section,
    pod_section,
    coldstart_section,
    coldstart_handler_section,
    boot_phases_section,
    first_request_section,
    spec_section,
    lossless_section,
    roofline_section,
]


def render_saved(paths: list[Path], *, pool: bool = False) -> str:
    """Markdown from saved results: bench JSON files (one section each, then a quantization
    summary) and boot logs (a cold-start breakdown row each). With ``pool``, the pod runs files
    among them (``pod-runs.json``) make one section: each server's medians over all their runs."""
    sections: list[str] = []
    if pool:
        json_files = {p: json.loads(p.read_text()) for p in paths if p.suffix == ".json"}
        pooled = {p: runs for p, runs in json_files.items() if _is_pod_runs(runs)}
        if pooled:
            paths = [p for p in paths if p not in pooled]
            runs = pool_pod_runs(list(pooled.values()))
            names = ", ".join(f"`{p.name}`" for p in pooled)
            sections.append(f"#### pooled: {names}\n\n" + render_markdown(_pod_results(runs)))
    quant_rows = []
    log_rows = []
    boots: dict[str, dict[str, float]] = {}
    for path in paths:
        if path.suffix == ".log":
            text = path.read_text(errors="replace")
            phases = boot_phases(text)
            if phases:  # a log the cold-start bench stamped
                boots[path.stem] = phases
                continue
            found = parse_boot_log(text)
            log_rows.append(
                f"| `{path.name}` | {fmt(found.get('first_item_s'))} | {fmt(found.get('worker_engine_ready_s'))} | "
                f"{boot_columns(found)} |"
            )
            continue
        results = json.loads(path.read_text())
        if _is_pod_runs(results):  # pod-runs.json: the runs of a pod bench, perhaps cut short
            results = _pod_results(results)
        sections.append(f"#### {results.get('label') or path.stem} (`{path.name}`)\n\n" + render_markdown(results))
        boots.update(boot_runs(results, path.stem))
        overhead, roofline = results.get("overhead"), results.get("roofline")
        if overhead and roofline:
            by_c = {r["concurrency"]: r for r in overhead["rows"]}
            bound = next((r for r in roofline["rows"] if "fraction_of_bound" in r), None)
            single, batch = by_c.get(1), by_c.get(256)
            interval = overhead.get("stream_interval") or 1
            label = path.stem + (f" (stream interval {interval})" if interval > 1 else "")
            quant_rows.append(
                f"| {label} | {roofline['weight_bytes_per_step'] / 1e9:.2f} | "
                f"{fmt(bound['measured_tok_s'] if bound else None, 1)} | "
                f"{fmt(bound['bound_tok_s'] if bound else None, 0)} | "
                f"{fmt(bound['fraction_of_bound'] if bound else None, 3)} | "
                f"{fmt(batch['handler']['throughput_tok_s'] if batch else None, 0)} | "
                f"{fmt(batch['vllm_asyncllm']['throughput_tok_s'] if batch else None, 0)} | "
                f"{fmt(single['throughput_ratio'] if single else None, 3)} / "
                f"{fmt(batch['throughput_ratio'] if batch else None, 3)} |"
            )
    out = []
    if quant_rows:
        out += [
            "| config | weight GB read per step | batch-1 decode tok/s (handler) | roofline tok/s | fraction of "
            "roofline | batch-256 tok/s (handler) | batch-256 tok/s (AsyncLLM) | throughput ratio c=1 / c=256 |",
            "|---|---|---|---|---|---|---|---|",
            *quant_rows,
            "",
        ]
    if boots:
        out += phase_table(boots)
    if log_rows:
        out += [
            "| boot log | first item s | engine ready s | weights load s | engine init s | of which compile s | "
            "graph capture s |",
            "|---|---|---|---|---|---|---|",
            *log_rows,
            "",
        ]
    return "\n".join(out + sections)


def _is_pod_runs(results: Any) -> bool:
    return isinstance(results, dict) and set(results) == {"pod", "vllm_server"}


def _pod_results(runs: dict[str, Any]) -> dict[str, Any]:
    """A pod section's results from runs alone (a runs file records no machine or command)."""
    first = runs["pod"][0][0]
    rows = pod_table(runs)
    counts = sorted({row["runs"] for row in rows})
    return {
        "command": "python -m worker bench --stage pod (its runs file, pod-runs.json)",
        "machine": "not recorded in a runs file",
        "pod": {
            "num_requests": "auto",
            "max_tokens": first["tokens"] // max(first["requests"], 1),
            # Pooled files may cover different concurrencies: a row's median is over its own runs.
            "repeats": counts[0] if len(counts) == 1 else f"{counts[0]}-{counts[-1]}",
            "rows": rows,
        },
    }


# ------------------------------------------------------------------------------ report
def write_report(results: dict[str, Any], out: Path) -> None:
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    (out / "bench.md").write_text(render_markdown(results))
    with contextlib.suppress(ImportError):
        plots(results, out)


def render_markdown(results: dict[str, Any]) -> str:
    """The run's report: one section per part it ran, each from its own table renderer."""
    lines = [f"Command: `{results['command']}`", "", f"Machine: {results['machine']}", ""]
    for section in SECTIONS:
        lines += section(results)
    return "\n".join(lines)


def plots(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "pod" in results or "overhead" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        if "overhead" in results:
            rows = results["overhead"]["rows"]
            xs = [r["concurrency"] for r in rows]
            ax.plot(xs, [r["handler"]["throughput_tok_s"] for r in rows], "o-", label="handler path")
            ax.plot(xs, [r["vllm_asyncllm"]["throughput_tok_s"] for r in rows], "s--", label="vLLM AsyncLLM")
        if "pod" in results:
            rows = results["pod"]["rows"]
            xs = [r["concurrency"] for r in rows]
            ax.plot(xs, [r["pod"]["throughput_tok_s"] for r in rows], "^-", label="pod server")
            ax.plot(xs, [r["vllm_server"]["throughput_tok_s"] for r in rows], "v--", label="vLLM OpenAI server")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tokens/s")
        ax.set_title("Throughput vs concurrency")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)
    if "spec" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results["spec"]["rows"]:
            if r["mean_acceptance_length"] is None or r["speedup"] is None:
                continue
            ax.scatter(r["mean_acceptance_length"], r["speedup"])
            ax.annotate(
                f"{r['draft'].removeprefix('tiny:')} k={r['k']}",
                (r["mean_acceptance_length"], r["speedup"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        ax.axhline(1.0, color="grey", lw=1)
        ax.axvline(1.5, color="red", lw=1, ls=":", label="0.5 accepted tokens/step")
        ax.set_xlabel("mean acceptance length (tokens per verify step)")
        ax.set_ylabel("speedup vs no speculation")
        ax.set_title("Speculative decoding: speedup vs acceptance")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "speculative.png", dpi=120)
        plt.close(fig)
