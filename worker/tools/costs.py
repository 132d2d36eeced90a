"""``python -m worker plan``: serverless versus a pod for a day's traffic shape, from the user's own
prices (inputs, never built-in facts; the defaults are marked as examples)."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


# ------------------------------------------------------------------------------ cost plan
@dataclass(frozen=True, slots=True)
class CostPlan:
    serverless_cost_per_day: float
    pod_cost_per_day: float
    num_pods: int
    gpu_seconds_per_day: float
    tokens_per_day: float
    serverless_cost_per_million_tokens: float
    pod_cost_per_million_tokens: float
    break_even_requests_per_hour: float | None
    cheaper: str
    serverless_cold_starts_per_day: float = 0.0


@dataclass(frozen=True, slots=True)
class ServerlessHour:
    billed_s: float
    cold_starts: float
    cost: float


def serverless_hour(
    requests: float,
    *,
    tokens_per_request: float,
    tokens_per_s: float,
    price_per_s: float,
    cold_start_s: float,
    idle_timeout_s: float,
) -> ServerlessHour:
    """Billed seconds and cold starts in one hour of ``requests`` arriving at random (Poisson).

    A worker's life is a run of cycles: it idles after its last job; if the next request comes
    within ``idle_timeout_s`` it serves it warm (the idle wait billed), otherwise it has stopped
    (billed ``idle_timeout_s``) and the request pays a cold start, while requests arriving during
    that boot queue for it; then it is busy until no request is left. With arrival rate ``lam``
    per worker and GPU time ``S`` a request, a gap outlasts the timeout with probability
    ``p = exp(-lam * T)``, an idle wait bills ``E[min(gap, T)] = (1 - p) / lam``, and a busy period
    takes ``(S + p * lam * C * S) / (1 - lam * S)`` (the queue's work, M/G/1). Cycles per hour
    are 3600 s over a cycle's mean length. Load beyond one GPU is spread over enough workers.
    """
    if requests <= 0:
        return ServerlessHour(0.0, 0.0, 0.0)
    service_s = tokens_per_request / tokens_per_s
    busy = requests * service_s
    num_workers = max(1, math.ceil(busy / (3600 * 0.9)))  # a worker busier than 90% queues without bound
    lam = requests / num_workers / 3600
    utilization = lam * service_s
    p_cold = math.exp(-lam * idle_timeout_s)
    busy_period = (service_s + p_cold * lam * cold_start_s * service_s) / (1 - utilization)
    cycle = 1 / lam + p_cold * cold_start_s + busy_period
    billed_per_cycle = (1 - p_cold) / lam + p_cold * cold_start_s + busy_period  # the first term: E[min(gap, T)]
    cycles = num_workers * 3600 / cycle
    billed = min(cycles * billed_per_cycle, num_workers * 3600.0)
    return ServerlessHour(billed_s=billed, cold_starts=cycles * p_cold, cost=billed * price_per_s)


def serverless_cost_per_hour(requests: float, **kwargs: float) -> float:
    """The cost of one hour of ``requests`` on serverless (:func:`serverless_hour`)."""
    return serverless_hour(requests, **kwargs).cost


def plan_costs(
    requests_per_hour: list[float],
    *,
    tokens_per_request: float,
    tokens_per_s: float,
    serverless_price_per_s: float,
    pod_price_per_hour: float,
    cold_start_s: float = 60.0,
    idle_timeout_s: float = 5.0,
    pod_max_utilization: float = 0.8,
) -> CostPlan:
    if len(requests_per_hour) != 24:
        raise ValueError("give 24 hourly request counts")
    hours = [
        serverless_hour(
            r,
            tokens_per_request=tokens_per_request,
            tokens_per_s=tokens_per_s,
            price_per_s=serverless_price_per_s,
            cold_start_s=cold_start_s,
            idle_timeout_s=idle_timeout_s,
        )
        for r in requests_per_hour
    ]
    serverless = sum(hour.cost for hour in hours)
    peak_busy = max(requests_per_hour) * tokens_per_request / tokens_per_s
    num_pods = max(1, math.ceil(peak_busy / (3600 * pod_max_utilization)))
    pod = num_pods * 24 * pod_price_per_hour
    tokens = sum(requests_per_hour) * tokens_per_request
    gpu_seconds = tokens / tokens_per_s

    def daily(rate: float) -> tuple[float, float]:
        s = 24 * serverless_cost_per_hour(
            rate,
            tokens_per_request=tokens_per_request,
            tokens_per_s=tokens_per_s,
            price_per_s=serverless_price_per_s,
            cold_start_s=cold_start_s,
            idle_timeout_s=idle_timeout_s,
        )
        pods = max(1, math.ceil(rate * tokens_per_request / tokens_per_s / (3600 * pod_max_utilization)))
        return s, pods * 24 * pod_price_per_hour

    break_even = None
    high = 3600 * tokens_per_s / tokens_per_request * pod_max_utilization  # one pod's capacity, requests/hour
    low_s, low_p = daily(1e-9)
    high_s, high_p = daily(high)
    if (low_s - low_p) * (high_s - high_p) <= 0:
        lo, hi = 1e-9, high
        for _ in range(100):
            mid = (lo + hi) / 2
            s, p = daily(mid)
            if (s - p) * (low_s - low_p) > 0:
                lo = mid
            else:
                hi = mid
        break_even = (lo + hi) / 2
    per_m = 1e6 / tokens if tokens else float("nan")
    return CostPlan(
        serverless_cost_per_day=serverless,
        pod_cost_per_day=pod,
        num_pods=num_pods,
        gpu_seconds_per_day=gpu_seconds,
        tokens_per_day=tokens,
        serverless_cost_per_million_tokens=serverless * per_m,
        pod_cost_per_million_tokens=pod * per_m,
        break_even_requests_per_hour=break_even,
        cheaper="serverless" if serverless < pod else "pod",
        serverless_cold_starts_per_day=sum(hour.cold_starts for hour in hours),
    )


# Example prices, to be replaced with your own: they are placeholders of a plausible order of
# magnitude for one 80 GB GPU, not quotes.
EXAMPLE_SERVERLESS_PRICE_PER_S = 0.00076


EXAMPLE_POD_PRICE_PER_HOUR = 2.00


def _hours(text: str) -> list[float]:
    path = Path(text)
    if path.exists():
        text = path.read_text()
    values = [float(v) for v in text.replace("\n", ",").split(",") if v.strip()]
    return values * 24 if len(values) == 1 else values


def main_plan(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker plan", description="serverless or pod for a traffic shape")
    parser.add_argument(
        "--requests-per-hour", required=True, help="one number (flat), 24 comma-separated numbers, or a file of them"
    )
    parser.add_argument("--tokens-per-request", type=float, default=500, help="output tokens per request")
    parser.add_argument(
        "--tokens-per-s",
        type=float,
        required=True,
        help="output tokens/s one GPU sustains at your concurrency (measure: python -m worker bench)",
    )
    parser.add_argument(
        "--serverless-price-per-s",
        type=float,
        default=EXAMPLE_SERVERLESS_PRICE_PER_S,
        help=f"your price per GPU-second (example default {EXAMPLE_SERVERLESS_PRICE_PER_S})",
    )
    parser.add_argument(
        "--pod-price-per-hour",
        type=float,
        default=EXAMPLE_POD_PRICE_PER_HOUR,
        help=f"your price per pod-hour (example default {EXAMPLE_POD_PRICE_PER_HOUR})",
    )
    parser.add_argument("--cold-start-s", type=float, default=60.0, help="a worker's boot to its first token")
    parser.add_argument(
        "--idle-timeout-s", type=float, default=5.0, help="how long a worker waits for a job before it stops"
    )
    parser.add_argument("--plot", type=Path, help="write a PNG of daily cost vs load")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        hours = _hours(args.requests_per_hour)
    except ValueError:
        what = args.requests_per_hour
        if "/" in what or what.endswith((".csv", ".txt")):  # meant as a file, and no such file
            parser.error(f"argument --requests-per-hour: no file {what!r} (or not numbers separated by commas)")
        parser.error(f"argument --requests-per-hour: {what!r} is not numbers separated by commas")
    if len(hours) != 24 or min(hours) < 0:
        parser.error("argument --requests-per-hour: give one number (a flat day) or 24 hourly counts, none negative")
    if not sum(hours):
        parser.error("argument --requests-per-hour: no requests in the day: nothing to cost per token")
    for name in ("tokens_per_request", "tokens_per_s", "serverless_price_per_s", "pod_price_per_hour"):
        if getattr(args, name) <= 0:
            parser.error(f"argument --{name.replace('_', '-')}: must be positive")
    for name in ("cold_start_s", "idle_timeout_s"):
        if getattr(args, name) < 0:
            parser.error(f"argument --{name.replace('_', '-')}: must not be negative")
    kwargs = {
        "tokens_per_request": args.tokens_per_request,
        "tokens_per_s": args.tokens_per_s,
        "serverless_price_per_s": args.serverless_price_per_s,
        "pod_price_per_hour": args.pod_price_per_hour,
        "cold_start_s": args.cold_start_s,
        "idle_timeout_s": args.idle_timeout_s,
    }
    result = plan_costs(hours, **kwargs)
    is_example = (
        args.serverless_price_per_s == EXAMPLE_SERVERLESS_PRICE_PER_S
        or args.pod_price_per_hour == EXAMPLE_POD_PRICE_PER_HOUR
    )
    if args.json:
        print(json.dumps(asdict(result), indent=1))
    else:
        print(
            "\n".join(
                [
                    f"traffic: {sum(hours):,.0f} requests/day, {result.tokens_per_day:,.0f} tokens/day, "
                    f"{result.gpu_seconds_per_day / 3600:,.2f} GPU-hours of work at {args.tokens_per_s:,.0f} tok/s",
                    f"serverless: ${result.serverless_cost_per_day:,.2f}/day, "
                    f"${result.serverless_cost_per_million_tokens:,.3f} per million tokens, "
                    f"~{result.serverless_cold_starts_per_day:,.0f} cold starts/day "
                    f"({args.cold_start_s:g} s each, idle timeout {args.idle_timeout_s:g} s)",
                    f"pod ({result.num_pods} x ${args.pod_price_per_hour}/h): ${result.pod_cost_per_day:,.2f}/day, "
                    f"${result.pod_cost_per_million_tokens:,.3f} per million tokens",
                    "break-even (flat load): "
                    + (
                        f"{result.break_even_requests_per_hour:,.0f} requests/hour"
                        if result.break_even_requests_per_hour
                        else "none within one pod's capacity"
                    ),
                    f"cheaper: {result.cheaper}",
                    *(
                        [
                            "(prices are the EXAMPLE defaults: pass your own "
                            "--serverless-price-per-s / --pod-price-per-hour)"
                        ]
                        if is_example
                        else []
                    ),
                ]
            )
        )
    if args.plot:
        _plot(args.plot, hours=hours, result=result, **kwargs)
    return 0


def _plot(path: Path, *, hours: list[float], result: CostPlan, **kwargs: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = 3600 * kwargs["tokens_per_s"] / kwargs["tokens_per_request"]
    rates = [capacity * i / 200 for i in range(1, 201)]
    serverless, pod = [], []
    for rate in rates:
        plan = plan_costs([rate] * 24, **kwargs)
        serverless.append(plan.serverless_cost_per_day)
        pod.append(plan.pod_cost_per_day)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(rates, serverless, label="serverless")
    ax.plot(rates, pod, label="pod")
    if result.break_even_requests_per_hour:
        ax.axvline(result.break_even_requests_per_hour, color="grey", ls=":", label="break-even")
    ax.axvline(sum(hours) / 24, color="red", ls="--", lw=1, label="your mean load")
    ax.set_xlabel("requests per hour (flat load)")
    ax.set_ylabel("cost per day ($)")
    ax.set_title("Serverless vs pod")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
