"""The soak's plot: each process's RSS, descriptors and threads, and the engines' queues, over time."""

from __future__ import annotations

from pathlib import Path

from worker.tools.soak.run import SoakResult

__all__ = ["plot"]


def plot(result: SoakResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result.samples
    minutes = [s["t_s"] / 60 for s in samples]
    keys = sorted({key for s in samples for key in s["processes"]})
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    for ax, series, label in zip(
        axes[:3], ("rss_mib", "fds", "threads"), ("RSS (MiB)", "open fds", "threads"), strict=True
    ):
        for key in keys:
            ax.plot(minutes, [s["processes"].get(key, {}).get(series) for s in samples], label=key, marker=".")
        ax.set_ylabel(label)
        ax.axvline(result.summary["warmup_minutes"], color="grey", linestyle=":")
    axes[0].legend(fontsize=7, ncol=2)
    ax = axes[3]
    for role in ("pod", "serverless"):
        for gauge, style in (("vllm:num_requests_running", "-"), ("vllm:num_requests_waiting", "--")):
            values = [s["gauges"].get(role, {}).get(gauge) for s in samples]
            ax.plot(minutes, values, style, label=f"{role} {gauge.split(':')[1]}", marker=".")
    ax.set_ylabel("requests in engine")
    ax.set_xlabel("minutes")
    ax.legend(fontsize=7)
    summary = result.summary
    fig.suptitle(f"{summary['command']}\n{summary['requests']} requests: {summary['outcomes']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
