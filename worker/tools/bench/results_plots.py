"""The results page's plots, as SVG text from the index's points: the same files give the same bytes
(no date, no creator, a fixed hash salt, text kept as text), so a test can compare them.

A plot is ``{"file", "title", "ylabel", "style": "lines" | "strip", "hline", "panels": [{"title",
"series": [{"label", "of": selector, "dashed", "group"}]}]}``: ``lines`` draws each series against
its points' ``x`` (streams, on a log axis), ``strip`` draws each value as a dot over its series'
``group`` (one column per group, one colour per label), with a series' ``goal`` as a dashed mark.
``from_zero`` starts the value axis at 0."""

from __future__ import annotations

import io
from typing import Any

from worker.tools.bench.results_index import Index, Point

__all__ = ["render_plot"]

_RC: dict[str, Any] = {
    "svg.hashsalt": "runpod-vllm-worker results",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
}


def render_plot(index: Index, plot: dict[str, Any]) -> str:
    """The SVG of ``plot``, drawn from its series' points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot["panels"]
    with matplotlib.rc_context(_RC):  # type: ignore[arg-type]  # its keys are a Literal of rc names
        fig, axes = plt.subplots(1, len(panels), figsize=(max(7.0, 5.2 * len(panels)), 3.8), squeeze=False)
        for ax, panel in zip(axes[0], panels, strict=True):
            series = [(s, index.points(s["of"])) for s in panel["series"]]
            if plot.get("style", "lines") == "strip":
                _strip(ax, series)
            else:
                _lines(ax, series)
            if "hline" in plot:
                ax.axhline(plot["hline"], color="grey", linewidth=0.8)
            if plot.get("from_zero"):
                ax.set_ylim(bottom=0)
            ax.set_title(panel.get("title", ""))
            ax.set_ylabel(plot["ylabel"])
            ax.grid(alpha=0.3)
        fig.suptitle(plot["title"])
        fig.tight_layout()
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return out.getvalue()


def _lines(ax: Any, series: list[tuple[dict[str, Any], list[Point]]]) -> None:
    for i, (spec, points) in enumerate(series):
        placed = sorted((p.x, p.value) for p in points if p.x is not None)
        if not placed:
            continue
        ax.plot(
            [x for x, _ in placed],
            [y for _, y in placed],
            marker="o",
            markersize=4,
            color=f"C{i % 10}",
            linestyle="--" if spec.get("dashed") else "-",
            label=spec["label"],
        )
    ax.set_xscale("log", base=2)
    ticks = sorted({p.x for _, points in series for p in points if p.x is not None})
    ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrent streams")
    ax.legend(fontsize=7)


def _strip(ax: Any, series: list[tuple[dict[str, Any], list[Point]]]) -> None:
    groups = list(dict.fromkeys(spec["group"] for spec, _ in series))
    labels = list(dict.fromkeys(spec["label"] for spec, _ in series))
    width = 0.6 / max(1, len(labels))
    for spec, points in series:
        i = labels.index(spec["label"])
        x = groups.index(spec["group"]) + (i - (len(labels) - 1) / 2) * width
        first = series[[s["label"] for s, _ in series].index(spec["label"])][0] is spec
        ax.scatter(
            [x] * len(points),
            [p.value for p in points],
            s=14,
            color=f"C{i % 10}",
            alpha=0.8,
            label=spec["label"] if first else None,
        )
        if "goal" in spec:  # a short dashed line over this series' dots
            ax.plot([x - width / 2, x + width / 2], [spec["goal"]] * 2, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper left")
