"""The report's tables, one renderer per part: each takes a run's results and returns its Markdown
lines (none when the run did not include the part); ``report.render_markdown`` joins them. Here:
the serving paths (overhead, the stats path, the pod) and the helpers every table uses;
``tables_boot.py``: cold start, first request, speculation, roofline."""

from __future__ import annotations

from typing import Any

from worker.tools.bench.coldstart import PHASE_MARKERS

__all__ = [
    "boot_columns",
    "boot_runs",
    "fmt",
    "overhead_section",
    "phase_table",
    "pod_section",
    "stats_path_section",
    "stats_path_table",
]


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


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


def boot_runs(results: dict[str, Any], label: str) -> dict[str, dict[str, float]]:
    runs = {}
    for part in ("coldstart", "coldstart_handler"):
        phases = (results.get(part) or {}).get("handler", {}).get("phases_end_s")
        if phases:
            runs[label] = phases
    return runs


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
    if stats.get("design") == "answered aborts":
        return _answered_aborts_table(stats, itl_ms)
    stops = stats.get("stops", {"all_stop": "\n\n"})
    labels = [
        label for label in ("no_stop", "all_stop", "agent_stop", "all_stop_every_step") if label in stats["rows"][0]
    ]
    lines = [
        "### Cost of the exact-stats path per engine step (CPU time, timed directly)",
        "",
        f"vLLM's types and serialiser, {stats['steps']} steps, k={stats['k']}; "
        + (
            f"vLLM's tracking and the hook timed alone (minimum of {stats['repeats']} runs), the transport "
            f"with snapshots minus without, paired per step (median of {stats['repeats']} runs), the cyclic "
            "collector off"
            if stats.get("hook_timed") == "directly"
            else f"minimum of {stats['repeats']} alternating runs, stats on minus stats off"
        )
        + ". Every request gets a snapshot "
        + (f"every {stats['snapshot_every_steps']} steps" if stats.get("snapshot_every_steps") else "periodically")
        + (
            f"; one with stop strings also on each step that can complete one ({stats['text']})"
            if stats.get("text")
            else "; one with stop strings on every step (before trigger sets)"
        )
        + ". Stop strings: "
        + ", ".join(f"{label} {stop!r}" for label, stop in stops.items())
        + ".",
        "",
        "| batch | case | vLLM's per-request tracking µs | worker's hook µs | snapshots' transport µs "
        "| total µs | snapshots per request-step | share of a step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in stats["rows"]:
        step_us = itl_ms[r["batch"]] * 1000 if itl_ms.get(r["batch"]) else None
        for label in labels:
            c = r[label]
            share = f"{100 * c['total_us'] / step_us:.2f}%" if step_us else "-"
            rate = f"{100 * c['snapshot_rate']:.1f}%" if "snapshot_rate" in c else "-"
            lines.append(
                f"| {r['batch']} | {label} | {fmt(c['observe_us'], 1)} | {fmt(c['hook_us'], 1)} | "
                f"{fmt(c['transport_us'], 1)} | {fmt(c['total_us'], 1)} | {rate} | {share} |"
            )
    return [*lines, ""]


def _answered_aborts_table(stats: dict[str, Any], itl_ms: dict[int, float]) -> list[str]:
    lines = [
        "### Cost of the exact-stats path per engine step (CPU time, timed directly)",
        "",
        f"vLLM's types and serialiser, {stats['steps']} steps, k={stats['k']}, n-gram shapes; vLLM's tracking, "
        f"the hook and the ends timed alone (minimum of {stats['repeats']} runs), the answers' transport paired "
        f"per step (median of {stats['repeats']} runs), the cyclic collector off. A snapshot of every request "
        f"every {stats['snapshot_every_steps']} steps (for cancellations); a request ended by its stop string "
        "has its abort answered by the engine core (its counts and the shape of its last steps), "
        f"{stats['abort_lag_steps']} steps after the stop string. Text: {stats['text']}; all_stop from it "
        'without blank lines (no request ends), all_stop_ending ending at each blank line. "ends": the '
        "answered aborts and the adds of the requests that take their place, as whole calls into a stand-in "
        "scheduler (its own bookkeeping counted too: in brackets, where measured, the same calls without the "
        "hooks). The frontend's scan for held requests runs in the "
        "frontend's process, and vLLM's own making of the requests that replace the ended ones is there "
        "for scale: both beside the total, not in it.",
        "",
        "| batch | case | vLLM's per-request tracking µs | worker's hook µs | ends µs | answers' transport µs "
        "| total µs | requests ended per step | share of a step | frontend scan µs | vLLM's `Request()` of "
        "the replacements µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stats["rows"]:
        step_us = itl_ms[r["batch"]] * 1000 if itl_ms.get(r["batch"]) else None
        for label in [key for key in r if key != "batch"]:
            c = r[label]
            share = f"{100 * c['total_us'] / step_us:.2f}%" if step_us else "-"
            lines.append(
                f"| {r['batch']} | {label} | {fmt(c['observe_us'], 1)} | {fmt(c['hook_us'], 1)} | "
                f"{fmt(c['ends_us'], 1)}{_of_which(c.get('stand_in_ends_us'))} | {fmt(c['transport_us'], 1)} | "
                f"{fmt(c['total_us'], 1)} | "
                f"{c['ends_per_step']:.2f} | {share} | {fmt(c['frontend_us'], 1)} | "
                f"{fmt(c.get('request_creation_us'), 1)} |"
            )
    return [*lines, ""]


def _of_which(stand_in_us: float | None) -> str:
    """The stand-in scheduler's own share of the ends, where the run measured it."""
    return f" (stand-in {fmt(stand_in_us, 1)})" if stand_in_us else ""


def overhead_section(results: dict[str, Any]) -> list[str]:
    if "overhead" not in results:
        return []
    o = results["overhead"]
    lines = [
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
        stop = exact.get("with_stop")
        if stop:
            summed, taken, counters = stop["per_request_sum"], stop["taken_off"], stop["engine_counters"]
            held = stop.get("held_ms")
            lines += [
                f"The same jobs, each with a stop string from the first one's text (endings: {stop['finish_reasons']}; "
                f"released exact {stop['released']['exact']}, partial {stop['released']['partial']}; outputs "
                f"taken off per ending: {stop['outputs_taken_off']}"
                + (f"; held {fmt(held['median'], 1)} ms median, {fmt(held['max'], 1)} max" if held else "")
                + f"), summed {summed['num_drafts']} / {summed['num_draft_tokens']} / "
                f"{summed['num_accepted_tokens']} plus taken off {taken['num_drafts']} / {taken['num_draft_tokens']} "
                f"/ {taken['num_accepted_tokens']}; vLLM's counters {counters['num_drafts']} / "
                f"{counters['num_draft_tokens']} / {counters['num_accepted_tokens']}: "
                + ("**equal**." if stop["equal"] else "**not equal**."),
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
    return lines


def stats_path_section(results: dict[str, Any]) -> list[str]:
    if "stats_path" not in results:
        return []
    return stats_path_table(results["stats_path"], results.get("overhead"))


def pod_section(results: dict[str, Any]) -> list[str]:
    if "pod" not in results:
        return []
    p = results["pod"]
    baseline = p.get("baseline", "vLLM's OpenAI server")
    short = "1-API pod" if baseline.startswith("pod") else "vLLM"
    lines = [
        f"### Pod server vs {baseline} (same engine arguments, same streaming client)",
        "",
        f"{p['num_requests']} requests x {p['max_tokens']} tokens, `/v1/completions` streaming, median of "
        f"{p['repeats']} runs per server; beside the ratio, each repeat's pair of runs: their ratios' range, "
        "and from 3 pairs their mean ± 2 standard errors; "
        + (
            f"the pod with API_SERVER_COUNT={p['api_server_count']}."
            if "api_server_count" in p
            else "the pod's API_SERVER_COUNT is not in a runs file."
        ),
        "",
        f"| concurrency | pod tok/s | {short} tok/s | throughput ratio | TTFT p50 ms (pod / {short}) | "
        f"TTFT p99 ms (pod / {short}) | ITL ms (pod / {short}) | API processes' CPU ms per token (pod / {short}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in p["rows"]:
        a, b = r["pod"], r["vllm_server"]
        paired = [x for x in r.get("throughput_ratio_runs", []) if x is not None]
        notes = [f"{min(paired):.2f}-{max(paired):.2f}"] if len(paired) > 1 else []
        if r.get("throughput_ratio_mean") is not None:
            notes.append(f"{r['throughput_ratio_mean']:.3f} ± {r['throughput_ratio_2se']:.3f}")
        spread = f" ({'; '.join(notes)})" if notes else ""
        lines.append(
            f"| {r['concurrency']} | {fmt(a['throughput_tok_s'], 1)} | {fmt(b['throughput_tok_s'], 1)} | "
            f"{fmt(r['throughput_ratio'], 3)}{spread} | {fmt(a['ttft_p50_ms'], 1)} / {fmt(b['ttft_p50_ms'], 1)} | "
            f"{fmt(a['ttft_p99_ms'], 1)} / {fmt(b['ttft_p99_ms'], 1)} | "
            f"{fmt(a['itl_mean_ms'], 2)} / {fmt(b['itl_mean_ms'], 2)} | "
            f"{fmt(a.get('api_cpu_ms_per_token'), 3)} / {fmt(b.get('api_cpu_ms_per_token'), 3)} |"
        )
    lines.append("")
    return lines
