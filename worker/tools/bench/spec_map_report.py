"""The speculation map's report: Markdown tables and a plot of a saved ``spec_map.json``, and the
step-cost figures (:class:`worker.speculation.cost.StepCost`) read back off it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from worker.tools.bench.spec_map_config import baseline, config_env

__all__ = ["fill_vs_none", "fit_step_cost", "render", "render_pooled"]


def fit_step_cost(result: dict[str, Any], *, static: str, off: str, knee_tokens: int = 512) -> dict[str, float]:
    """:class:`worker.speculation.cost.StepCost` figures read off a map's engine steps (``ms_per_step``):
    the baseline (``none``, or ``none+KEY=VALUE``: :func:`.spec_map_config.baseline`) gives the
    target's step (``base_ms`` at one stream, ``per_seq_ms`` the least-squares
    slope up to 64 streams); ``off``, a draft-model configuration the controller held at k = 0,
    gives the draft's KV-sync pass over the baseline (``draft_pass_ms`` and ``draft_per_seq_ms``, a
    line through its two smallest loads); ``static`` (k drafts every step) the rest of a verify step
    below the knee (``verify_ms``) and, past ``knee_tokens``, ``per_token_ms``."""
    table = result["table"]
    k = json.loads(config_env({}, static)["SPECULATIVE_CONFIG"])["num_speculative_tokens"]

    def steps(name: str) -> dict[int, float]:
        rows = table.get(name, {})
        return {int(c): row["ms_per_step"] for c, row in rows.items() if row.get("ms_per_step")}

    plain = baseline(list(table))
    if plain is None:
        raise ValueError("the map has no configuration without speculation (none) to fit against")
    none, spec, idle = steps(plain), steps(static), steps(off)
    low = sorted(b for b in none if b <= 64)
    base = none[low[0]]
    xs = [b - 1 for b in low]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(none[b] for b in low)
    spread = sum((x - mean_x) ** 2 for x in xs)
    per_seq = sum((x - mean_x) * (none[b] - mean_y) for x, b in zip(xs, low, strict=True)) / spread if spread else 0.0
    sync = sorted((b, idle[b] - none[b]) for b in idle if b in none)
    (b1, y1), (b2, y2) = sync[0], sync[min(1, len(sync) - 1)]
    draft_per_seq = (y2 - y1) / (b2 - b1) if b2 != b1 else 0.0
    draft_pass = y1 - draft_per_seq * b1
    extra = {b: spec[b] - none[b] - k * (draft_pass + draft_per_seq * b) for b in spec if b in none}
    below = [v for b, v in extra.items() if (k + 1) * b <= knee_tokens]
    verify = statistics.median(below) if below else 0.0
    above = [(v - verify) / ((k + 1) * b - knee_tokens) for b, v in extra.items() if (k + 1) * b > knee_tokens]
    return {
        "base_ms": round(base, 3),
        "per_seq_ms": round(per_seq, 4),
        "per_token_ms": round(statistics.median(above), 4) if above else 0.0,
        "knee_tokens": knee_tokens,
        "verify_ms": round(verify, 3),
        "draft_pass_ms": round(draft_pass, 3),
        "draft_per_seq_ms": round(draft_per_seq, 4),
    }


def fill_vs_none(table: dict[str, Any], configs: list[str]) -> None:
    """Each row's throughput against the baseline's at its concurrency (``vs_none``), where a row has
    none yet: every row of a fresh table, and the rows of maps saved before ``none+KEY=VALUE``
    counted as the baseline."""
    base = table.get(baseline(configs) or "", {})
    for by_c in table.values():
        for c, row in by_c.items():
            if row and row.get("vs_none") is None:
                ref = (base.get(c) or {}).get("throughput_tok_s")
                row["vs_none"] = row["throughput_tok_s"] / ref if ref and row.get("throughput_tok_s") else None


def _filled(result: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of a map's table with ``vs_none`` filled in, and its configurations in run order."""
    table = {name: {c: dict(row) if row else row for c, row in by_c.items()} for name, by_c in result["table"].items()}
    names = [name for name in result["configs"] if name in table]
    fill_vs_none(table, names)
    return table, names


def render_pooled(maps: list[tuple[str, dict[str, Any]]], *, plot: Path | None = None) -> str:
    """Several maps as one table of throughput against no speculation (and, with ``plot``, one
    plot): each configuration against the no-speculation engine of its own run, since hosts and
    runs differ, labelled by its map. Raises ValueError, in one line, for a map without one, or
    for maps without a speculative configuration."""
    rows: list[tuple[str, dict[int, float]]] = []
    for label, result in maps:
        table, names = _filled(result)
        base = baseline(names)
        if base is None:
            raise ValueError(f"{label}: no configuration without speculation to compare with")
        for name in names:
            if name != base:
                ratios = {int(c): row["vs_none"] for c, row in table[name].items() if row and row.get("vs_none")}
                rows.append((f"`{name}` ({label})", ratios))
    if not rows:
        raise ValueError("these maps hold no configuration with speculation to compare")
    concurrencies = sorted({c for _, ratios in rows for c in ratios})
    lines = [
        "Throughput against no speculation in the same run:",
        "",
        "| configuration (map) | " + " | ".join(f"{c} streams" for c in concurrencies) + " |",
        "|---|" + "---|" * len(concurrencies),
    ]
    for label, ratios in rows:
        cells = (f"{ratios[c]:.2f}x" if c in ratios else "-" for c in concurrencies)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if plot is not None:
        # Many lines: the controller's solid, static choices dashed.
        _plot(plot, [(label.replace("`", ""), ratios) for label, ratios in rows], vs_none=True, styled=True)
    return "\n".join(lines)


def _plot(path: Path, series: list[tuple[str, dict[int, float]]], *, vs_none: bool, styled: bool = False) -> None:
    """A PNG of ``series`` (label, value by streams) on a log axis of streams, each line drawn from
    the fewest streams up, whatever order the map ran them in: against no speculation (with its
    line at 1) or throughput. ``styled``: a colour each from a larger palette, ``auto``'s lines
    solid and thicker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5) if styled else (7, 4))
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]
    for i, (label, values) in enumerate(series):
        xs = sorted(values)
        style: dict[str, Any] = {}
        if styled:
            auto = ":auto" in label
            style = {
                "color": colors[i % len(colors)],
                "linestyle": "-" if auto else "--",
                "linewidth": 2 if auto else 1,
            }
        ax.plot(xs, [values[x] for x in xs], marker="o", label=label, **style)
    if vs_none:
        ax.axhline(1.0, color="grey", linewidth=0.8)
    ylabel = "throughput vs no speculation" if vs_none else "throughput, tok/s"
    title = "Where speculation pays" if vs_none else "Throughput by configuration"
    ax.set(xscale="log", xlabel="streams", ylabel=ylabel, title=title)
    ax.legend(fontsize=6 if styled else 7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def render(result: dict[str, Any], *, plot: Path | None = None) -> str:
    """Markdown tables of a map (throughput vs no speculation, ITL, acceptance, drafts per verify
    step, steps off per request) from its ``spec_map.json``; with ``plot``, a PNG of the first."""
    table, names = _filled(result)
    concurrencies = [str(c) for c in result["concurrencies"]]
    head = "| configuration | " + " | ".join(f"{c} streams" for c in concurrencies) + " |"
    rule = "|---|" + "---|" * len(concurrencies)

    def rows(cell: Any) -> list[str]:
        return [f"| `{name}` | " + " | ".join(cell(table[name].get(c)) for c in concurrencies) + " |" for name in names]

    def tok(row: dict[str, Any] | None) -> str:
        if not row or row.get("throughput_tok_s") is None:
            return "-"
        vs = row.get("vs_none")
        return f"{row['throughput_tok_s']:,.0f}" + (f" ({vs:.2f}x)" if vs else "")

    def itl(row: dict[str, Any] | None) -> str:
        return f"{row['itl_p50_ms']:.2f}" if row and row.get("itl_p50_ms") is not None else "-"

    def step(row: dict[str, Any] | None) -> str:
        return f"{row['ms_per_step']:.2f}" if row and row.get("ms_per_step") is not None else "-"

    def spec(row: dict[str, Any] | None) -> str:
        if not row or row.get("mean_acceptance_length") is None:
            return "-"
        runs = max(1, row["runs"])
        return f"{row['mean_acceptance_length']:.2f} / {row['mean_k_verified']:.2f} / {row['num_steps_off'] / runs:.0f}"

    has_none = baseline(names) is not None
    title = "Throughput, tok/s (vs no speculation):" if has_none else "Throughput, tok/s:"
    runs = [run for by_c in result.get("runs", {}).values() for wave in by_c.values() for run in wave]
    if result.get("mix") and runs and not any("steady_window_s" in run for run in runs):
        # Maps made before the steady window: one request per stream, the slowest class's time.
        title = "Throughput, tok/s, of whole waves of one request per stream (not a steady state):"
    lines = [title, "", head, rule, *rows(tok), ""]
    itl_title = "Median ITL, ms (every request of the wave):" if result.get("mix") else "Median ITL, ms:"
    lines += [itl_title, "", head, rule, *rows(itl), ""]
    if not result.get("mix"):  # a mixed wave's requests do not decode in lockstep: no step time
        lines += [
            "Engine step, ms (the wave's time over its steps; prefill included):",
            "",
            head,
            rule,
            *rows(step),
            "",
        ]
    lines += ["Acceptance length / drafts per verify step / steps off per wave:", "", head, rule, *rows(spec)]
    statics = [n for n in names if n.endswith(":static") and not n.startswith("ngram:")]
    offs = [n for n in names if n.endswith(":1.0:auto") and not n.startswith("ngram:")]
    if has_none and statics and offs:
        fitted = fit_step_cost(result, static=statics[0], off=offs[0])
        lines += ["", f"Step cost read off `{statics[0]}` and `{offs[0]}` (`fit_step_cost`): {fitted}"]
    if result.get("mix"):

        def classes(row: dict[str, Any] | None) -> str:
            values = (row or {}).get("acceptance_by_class")
            return " / ".join("-" if v is None else f"{v:.2f}" for v in values) if values else "-"

        rates = ", ".join(f"{rate:g}" for rate in result["mix"])
        lines += ["", f"Acceptance length by class (rates {rates}; request i in class i % n):", "", head, rule]
        lines += rows(classes)
    if result.get("errors"):
        lines += ["", "Errors: " + "; ".join(f"`{k}`: {v}" for k, v in result["errors"].items())]
    if plot is not None:
        # Against no speculation where the map ran it; a map of speculative configurations alone
        # (a comparison between them) plots their throughput.
        key = "vs_none" if has_none else "throughput_tok_s"
        series = [
            (
                name.split("/")[-1],
                {int(c): table[name][c][key] for c in concurrencies if (table[name].get(c) or {}).get(key)},
            )
            for name in names
        ]
        _plot(plot, series, vs_none=has_none)
    return "\n".join(lines)
