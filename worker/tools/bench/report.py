"""Markdown and plots from a run's JSON (nothing typed by hand), and tables from saved runs."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from worker.tools.bench.coldstart import PHASE_MARKERS, boot_phases, parse_boot_log
from worker.tools.bench.servers import pod_table, pool_pod_runs


def boot_columns(found: dict[str, float]) -> str:
    """Weights load, engine init, compile, graph capture: whichever of vLLM's log lines a release prints."""
    load = found.get("weights_load_s", found.get("model_load_s"))
    compile_s = found.get("torch_compile_s", found.get("compilation_s"))
    return " | ".join(fmt(v) for v in (load, found.get("engine_init_s"), compile_s, found.get("graph_capture_s")))


def phase_table(runs: dict[str, dict[str, float]]) -> list[str]:
    """Boot phases, one column per run: each phase's seconds (from the end of the previous phase
    found to its own line), then process start to first token. ``runs``: label -> ``phases_end_s``."""
    labels = list(runs)
    lines = [
        "| phase (ends at the log line that says so) | " + " | ".join(f"{label} s" for label in labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    names = [name for name, *_ in PHASE_MARKERS]
    for i, (name, description, *_) in enumerate(PHASE_MARKERS):
        cells = []
        for label in labels:
            ends = runs[label]
            before = [ends[n] for n in names[:i] if n in ends]
            cells.append(fmt(ends[name] - (before[-1] if before else 0.0), 1) if name in ends else "-")
        lines.append(f"| {description} | " + " | ".join(cells) + " |")
    total = [fmt(runs[label].get("first_token"), 1) for label in labels]
    lines += ["| **process start to first token** | " + " | ".join(f"**{t}**" for t in total) + " |", ""]
    return lines


def _boot_runs(results: dict[str, Any], label: str) -> dict[str, dict[str, float]]:
    runs = {}
    for part in ("coldstart", "coldstart_handler"):
        phases = (results.get(part) or {}).get("handler", {}).get("phases_end_s")
        if phases:
            runs[label] = phases
    return runs


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
        boots.update(_boot_runs(results, path.stem))
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
        "command": "scripts/gpu_bench.sh pod (its runs file, pod-runs.json)",
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


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render_markdown(results: dict[str, Any]) -> str:
    lines = [f"Command: `{results['command']}`", "", f"Machine: {results['machine']}", ""]
    if "overhead" in results:
        o = results["overhead"]
        lines += [
            "### Handler overhead (serverless code path vs vLLM AsyncLLM, one engine, one process)",
            "",
            f"{o['num_requests']} requests x {o['max_tokens']} tokens per concurrency level, median of "
            f"{o['repeats']} alternating runs. "
            + (
                "Both paths start from the same text prompt (AsyncLLM tokenizes it in `generate`)."
                if o.get("baseline_input") == "text"
                else "AsyncLLM was given the prompt's token ids, tokenized once; the handler tokenized every request."
            )
            + (
                f" Engine stream interval: {o['stream_interval']} token(s) per output, for both paths."
                if o.get("stream_interval")
                else ""
            )
            + (f" **Partial**: the run ended after {len(o['rows'])} concurrency level(s)." if o.get("partial") else ""),
            "",
            "| concurrency | handler tok/s | AsyncLLM tok/s | throughput ratio | TTFT p50 ms (handler / raw) | "
            "ITL ms (handler / raw) | ITL ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in o["rows"]:
            h, v = r["handler"], r["vllm_asyncllm"]
            lines.append(
                f"| {r['concurrency']} | {fmt(h['throughput_tok_s'], 1)} | {fmt(v['throughput_tok_s'], 1)} | "
                f"{fmt(r['throughput_ratio'], 3)} | {fmt(h['ttft_p50_ms'], 1)} / {fmt(v['ttft_p50_ms'], 1)} | "
                f"{fmt(h['itl_mean_ms'], 2)} / {fmt(v['itl_mean_ms'], 2)} | {fmt(r['itl_mean_ratio'], 3)} |"
            )
        lines.append("")
        exact = o.get("spec_exact")
        if exact:
            summed, counters = exact["per_request_sum"], exact["engine_counters"]
            lines += [
                f"Exactness: {exact['requests']} concurrent handler jobs ({exact['with_spec_decode']} with "
                f"`spec_decode`), summed: {summed['num_drafts']} drafts / {summed['num_draft_tokens']} drafted / "
                f"{summed['num_accepted_tokens']} accepted; vLLM's engine counters over the same interval: "
                f"{counters['num_drafts']} / {counters['num_draft_tokens']} / {counters['num_accepted_tokens']}: "
                + ("**equal**." if exact["equal"] else "**not equal**."),
                "",
            ]
        if o.get("stats_off_baseline"):
            lines += _engine_pair_table(
                o["rows"],
                other="handler_stats_off",
                prefix="stats",
                names=("stats on", "stats off", "on / off"),
                intro="Cost of exact per-request stats: the handler over this engine vs over an identical one "
                "without the stats path (`PER_REQUEST_SPEC_DECODE_METRICS=none`, vLLM's plain scheduler), "
                "booted side by side, alternating in the same repeats. Target: throughput ratio >= 0.99, "
                "ITL ratio <= 1.01.",
            )
        if o.get("aa_baseline"):
            lines += _engine_pair_table(
                o["rows"],
                other="handler_aa",
                prefix="aa",
                names=("engine A", "engine A'", "A / A'"),
                intro="A/A control: the handler over this engine vs over a second, identical engine booted "
                "beside it: the spread two equal engines show, against which the stats-off difference is judged.",
            )
    if "stats_path" in results:
        lines += stats_path_table(results["stats_path"], results.get("overhead"))
    if "pod" in results:
        p = results["pod"]
        lines += [
            "### Pod server vs vLLM's OpenAI server (same engine arguments, same streaming client)",
            "",
            f"{p['num_requests']} requests x {p['max_tokens']} tokens, `/v1/completions` streaming, median of "
            f"{p['repeats']} runs per server.",
            "",
            "| concurrency | pod tok/s | vLLM server tok/s | throughput ratio | TTFT p50 ms (pod / vLLM) | "
            "TTFT p99 ms (pod / vLLM) | ITL ms (pod / vLLM) | API process CPU ms per token (pod / vLLM) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in p["rows"]:
            a, b = r["pod"], r["vllm_server"]
            lines.append(
                f"| {r['concurrency']} | {fmt(a['throughput_tok_s'], 1)} | {fmt(b['throughput_tok_s'], 1)} | "
                f"{fmt(r['throughput_ratio'], 3)} | {fmt(a['ttft_p50_ms'], 1)} / {fmt(b['ttft_p50_ms'], 1)} | "
                f"{fmt(a['ttft_p99_ms'], 1)} / {fmt(b['ttft_p99_ms'], 1)} | "
                f"{fmt(a['itl_mean_ms'], 2)} / {fmt(b['itl_mean_ms'], 2)} | "
                f"{fmt(a.get('api_cpu_ms_per_token'), 3)} / {fmt(b.get('api_cpu_ms_per_token'), 3)} |"
            )
        lines.append("")
    if "coldstart" in results:
        c = results["coldstart"]
        h, s = c["handler"], c["vllm_server"]
        lines += [
            "### Cold start (process start to first streamed token)",
            "",
            "| | first token s | engine ready s | weights load s | engine init (profile, KV, warm-up) s | "
            "compile s | graph capture s |",
            "|---|---|---|---|---|---|---|",
            f"| `python handler.py --test_input` | {fmt(h['first_token_s'])} | "
            f"{fmt(h['breakdown'].get('worker_engine_ready_s'))} | {boot_columns(h['breakdown'])} |",
            f"| vLLM server + first request | {fmt(s['first_token_s'])} | {fmt(s['ready_s'])} | "
            f"{boot_columns(s['breakdown'])} |",
            "",
            f"`import handler`: {fmt(c['handler_import_s'] * 1000, 0)} ms (median of 5).",
            "",
        ]
    if "coldstart_handler" in results:
        h = results["coldstart_handler"]["handler"]
        lines += [
            "### Cold start, handler only",
            "",
            f"`python handler.py --test_input`: first token {fmt(h['first_token_s'])} s after process start, "
            f"engine ready at {fmt(h['breakdown'].get('worker_engine_ready_s'))} s.",
            "",
        ]
    boot_runs = _boot_runs(results, results.get("label") or "handler")
    if boot_runs:
        lines += ["### Where the handler's boot goes", "", *phase_table(boot_runs)]
    if "first_request" in results:
        f = results["first_request"]
        lines += [
            "### First request after boot",
            "",
            f"TTFT of the first request {fmt(f['first_ttft_ms'], 1)} ms; of the next "
            f"{len(f['after_ttfts_ms'])}, each after {f['idle_s']} s idle, {fmt(f['steady_ttft_ms'], 1)} ms "
            f"(median): ratio {fmt(f['ratio'])} (goal <= 2). Warm-up request during boot: "
            f"{'on' if f['warmup_request'] else 'off'}"
            + (f"; `ENGINE_ARGS` {json.dumps(f['engine_args'])}" if f.get("engine_args") else "")
            + ".",
            "",
        ]
        if f.get("first_featured_ttft_ms") is not None:
            lines += [
                f"The first request using the sampler's features ({', '.join(sorted(f['featured_sampling']))}): "
                f"TTFT {fmt(f['first_featured_ttft_ms'], 1)} ms against {fmt(f['steady_featured_ttft_ms'], 1)} ms "
                f"for the same request later: ratio {fmt(f['featured_ratio'])}.",
                "",
            ]
    if "spec" in results:
        sp = results["spec"]
        lines += [
            "### Speculative decoding (single stream, temperature 0)",
            "",
            f"Baseline without speculation: {fmt(sp['baseline']['decode_tok_s'], 1)} decode tok/s; "
            f"{sp['num_requests']} requests x {sp['max_tokens']} tokens per point"
            + (f", median of {sp['rounds']} rounds." if sp.get("rounds", 1) > 1 else "."),
            "",
            "| draft | k | decode tok/s | ms per token | speedup | acceptance rate | mean acceptance length | "
            "accepted per step | pays off | acceptance watchdog |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sp["rows"]:
            low = r.get("watchdog_low")
            watchdog = "-" if low is None else ("**fired**" if low else "quiet")
            lines.append(
                f"| {r['draft']} | {r['k']} | {fmt(r['decode_tok_s'], 1)} | {fmt(r.get('ms_per_token'))} | "
                f"{fmt(r['speedup'])} | {fmt(r['draft_acceptance_rate'], 3)} | {fmt(r['mean_acceptance_length'])} | "
                f"{fmt(r['accepted_per_step'])} | {'yes' if r['pays_off'] else 'no'} | {watchdog} |"
            )
        lines.append("")
    if "roofline" in results:
        ro = results["roofline"]
        lines += [
            "### Roofline: single-stream decode bound",
            "",
            f"{ro['num_params'] / 1e6:,.1f} M parameters; {ro['weight_bytes_per_step'] / 1e6:,.2f} MB of weights "
            f"and {ro['kv_bytes_per_token'] / 1e3:,.1f} kB of KV cache per token read per step "
            f"(quantization {ro['quantization'] or 'none'}, context {ro['context_len']}).",
            "",
            "| GPU | bandwidth GB/s | bound tok/s | measured tok/s | fraction |",
            "|---|---|---|---|---|",
        ]
        for r in ro["rows"]:
            lines.append(
                f"| {r['gpu']} | {r['bandwidth_gbs']:,.0f} | {fmt(r['bound_tok_s'], 0)} | "
                f"{fmt(r.get('measured_tok_s'), 1)} | {fmt(r.get('fraction_of_bound'), 3)} |"
            )
        lines.append("")
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


def _engine_pair_table(
    rows: list[dict[str, Any]], *, other: str, prefix: str, names: tuple[str, str, str], intro: str
) -> list[str]:
    """The handler over the first engine against the handler over a second one booted beside it."""
    first, second, pair = names
    lines = [
        intro,
        "",
        f"| concurrency | {first} tok/s | {second} tok/s | throughput ratio | ITL ms ({pair}) | ITL ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        h, o = r["handler"], r[other]
        lines.append(
            f"| {r['concurrency']} | {fmt(h['throughput_tok_s'], 1)} | {fmt(o['throughput_tok_s'], 1)} | "
            f"{fmt(r[prefix + '_throughput_ratio'], 3)} | {fmt(h['itl_mean_ms'], 2)} / "
            f"{fmt(o['itl_mean_ms'], 2)} | {fmt(r[prefix + '_itl_ratio'], 3)} |"
        )
    return [*lines, ""]


def stats_path_table(stats: dict[str, Any], overhead: dict[str, Any] | None) -> list[str]:
    """What the exact-stats path adds to an engine step, per batch size, against the step when the
    same run measured one (the handler's mean inter-token latency at that concurrency: a step
    yields at least one token per request, so the share is an upper bound)."""
    itl_ms = {r["concurrency"]: r["handler"]["itl_mean_ms"] for r in (overhead or {}).get("rows", [])}
    lines = [
        "### Cost of the exact-stats path per engine step (CPU time, timed directly)",
        "",
        f"vLLM's types and serialiser, {stats['steps']} steps, minimum of {stats['repeats']} alternating runs, "
        f"k={stats['k']}; stats on minus stats off. Without stop strings a request gets a snapshot "
        + (f"every {stats['snapshot_every_steps']} steps" if stats.get("snapshot_every_steps") else "periodically")
        + "; with them, every step.",
        "",
        "| batch | vLLM's per-request tracking µs | worker's hook µs | snapshots' transport µs | total µs "
        "| share of a step | total with stop strings µs | share of a step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in stats["rows"]:
        plain, stop = r["no_stop"], r["all_stop"]
        step_us = itl_ms[r["batch"]] * 1000 if itl_ms.get(r["batch"]) else None
        shares = [f"{100 * t / step_us:.2f}%" if step_us else "-" for t in (plain["total_us"], stop["total_us"])]
        lines.append(
            f"| {r['batch']} | {fmt(plain['observe_us'], 1)} | {fmt(plain['hook_us'], 1)} | "
            f"{fmt(plain['transport_us'], 1)} | {fmt(plain['total_us'], 1)} | {shares[0]} | "
            f"{fmt(stop['total_us'], 1)} | {shares[1]} |"
        )
    return [*lines, ""]
