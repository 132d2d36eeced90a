"""The report's tables for the boot and the model: cold start, where the boot goes, the first
request, speculative decoding and the roofline (see ``tables.py``)."""

from __future__ import annotations

import json
from typing import Any

from worker.tools.bench.tables import boot_columns, boot_runs, fmt, phase_table

__all__ = [
    "boot_phases_section",
    "coldstart_handler_section",
    "coldstart_section",
    "first_request_section",
    "lossless_section",
    "roofline_section",
    "spec_section",
]


def coldstart_section(results: dict[str, Any]) -> list[str]:
    if "coldstart" not in results:
        return []
    c = results["coldstart"]
    h, s = c["handler"], c.get("vllm_server")
    return [
        "### Cold start (process start to first streamed token)",
        "",
        "| | first token s | engine ready s | weights load s | engine init (profile, KV, warm-up) s | "
        "compile s | graph capture s |",
        "|---|---|---|---|---|---|---|",
        f"| `python handler.py --test_input` | {fmt(h['first_token_s'])} | "
        f"{fmt(h['breakdown'].get('worker_engine_ready_s'))} | {boot_columns(h['breakdown'])} |",
        *(
            [
                f"| vLLM server + first request | {fmt(s['first_token_s'])} | {fmt(s['ready_s'])} | "
                f"{boot_columns(s['breakdown'])} |"
            ]
            if s is not None
            else []
        ),
        "",
        f"`import handler`: {fmt(c['handler_import_s'] * 1000, 0)} ms (median of 5).",
        "",
    ]


def coldstart_handler_section(results: dict[str, Any]) -> list[str]:
    if "coldstart_handler" not in results:
        return []
    h = results["coldstart_handler"]["handler"]
    lines = [
        "### Cold start, handler only",
        "",
        f"`python handler.py --test_input`: first token {fmt(h['first_token_s'])} s after process start, "
        f"engine ready at {fmt(h['breakdown'].get('worker_engine_ready_s'))} s.",
        "",
    ]
    return lines


def boot_phases_section(results: dict[str, Any]) -> list[str]:
    runs = boot_runs(results, results.get("label") or "handler")
    return ["### Where the handler's boot goes", "", *phase_table(runs)] if runs else []


def first_request_section(results: dict[str, Any]) -> list[str]:
    if "first_request" not in results:
        return []
    f = results["first_request"]
    lines = [
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
    return lines


def spec_section(results: dict[str, Any]) -> list[str]:
    if "spec" not in results:
        return []
    sp = results["spec"]
    lines = [
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
    return lines


def roofline_section(results: dict[str, Any]) -> list[str]:
    if "roofline" not in results:
        return []
    ro = results["roofline"]
    lines = [
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
    return lines


def lossless_section(results: dict[str, Any]) -> list[str]:
    if "lossless" not in results:
        return []
    lines = ["### Is speculation lossless at temperature > 0? (token distributions, position by position)", ""]
    for block in results["lossless"]:
        sampling = ", ".join(f"{k} {v}" for k, v in block["sampling"].items())
        control = block["control"]
        lines += [
            f"{sampling}: {block['num_samples']} completions of {block['num_positions']} tokens per engine from "
            f"{block['prompt']!r}; a position differs when its total-variation distance exceeds the "
            f"{block['bootstrap']['quantile']} quantile of {block['bootstrap']['draws']} bootstrap draws from the "
            f"pooled A/A samples (thresholds {' / '.join(fmt(t, 3) for t in block['thresholds'])}).",
            "",
            "| engine against A (no speculation) | TV per position | positions over | target log-prob < -6 | verdict |",
            "|---|---|---|---|---|",
            f"| A' (A/A control) | {' / '.join(fmt(t, 3) for t in control['tv_per_position'])} | "
            f"{control['positions_over_threshold'] or 'none'} | {fmt(control['low_logprob_share'] * 100, 1)}% | "
            f"{'passes' if control['passes'] else '**fails**'} |",
        ]
        for row in block["rows"]:
            lines.append(
                f"| {row['config']} | {' / '.join(fmt(t, 3) for t in row['tv_per_position'])} | "
                f"{row['positions_over_threshold'] or 'none'} | {fmt(row['low_logprob_share'] * 100, 1)}% | "
                f"{'lossless' if row['lossless'] else '**lossy**'} |"
            )
        lines.append("")
        if not results.get("gpu") and not all(row["lossless"] for row in block["rows"]):
            lines += [LOSSY_ON_CPU, ""]
    return lines


# Why a speculating engine on vLLM's CPU build samples off the target's distribution (README, "Sampling").
LOSSY_ON_CPU = (
    "Lossy is expected here: vLLM's CPU build has no Triton, which its rejection sampler needs at "
    "temperature > 0, so a speculating CPU engine does not keep the target's distribution (the worker "
    "refuses such requests with an error saying so); on a GPU this part measures vLLM's real sampler."
)
