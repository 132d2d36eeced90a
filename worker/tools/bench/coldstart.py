"""Process start to first streamed token, and where the boot's time goes (vLLM's log lines)."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from worker.config import Settings
from worker.tools.bench.engines import EnginePool
from worker.tools.bench.servers import free_port, http_stream, server_process, vllm_server_args
from worker.tools.bench.timing import PROMPT, ROOT, RequestTiming

# ------------------------------------------------------------------------------ cold start
LOG_MARKERS = {
    "weights_load_s": r"Loading weights took ([\d.]+) seconds",
    "model_load_s": r"Model loading took .*? and ([\d.]+) seconds",
    "torch_compile_s": r"torch\.compile takes ([\d.]+) s",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "compilation_s": r"\(compilation: ([\d.]+) s\)",
    "worker_engine_ready_s": r"engine ready in ([\d.]+) s",
}


# Where the boot is, by the log line that ends each phase (vLLM 0.32's INFO lines and the
# worker's), in the order they come: name, what the phase is, the line's pattern, and the phase
# whose line must come first (the CUDA-graph lines appear twice: memory profiling, then capture).
# Seconds are the bench's own clock on every line, so the table needs no log timestamps (vLLM's
# have whole seconds).
PHASE_MARKERS: list[tuple[str, str, str, str | None]] = [
    ("vllm_import", "main process: vLLM's imports", r"vLLM imported in", None),
    (
        "vllm_config",
        "main process: engine config (vLLM's args, model config, tokenizer files)",
        r"engine config built in",
        None,
    ),
    # In logs without the two lines above (before they were written) this phase is the whole main process.
    ("engine_config", "engine core process start (its first line)", r"Initializing a V1 LLM engine", None),
    ("model_load", "engine core start, weights load", r"Model loading took", None),
    ("torch_compile", "torch.compile (or loading it from the cache)", r"torch\.compile (takes|took)", None),
    # With vLLM's startup plan applied the profile run stays, its memory measurement does not.
    (
        "kv_cache_profile",
        "profile run, CUDA-graph memory estimate",
        r"Available KV cache memory|for KV Cache as specified by kv_cache_memory_bytes",
        None,
    ),
    ("kernel_warmup", "kernel warm-up before the capture", r"Capturing CUDA graphs", "kv_cache_profile"),
    ("cuda_graph_capture", "CUDA-graph capture", r"Graph capturing finished", "kv_cache_profile"),
    ("engine_init_done", "rest of vLLM's engine init", r"init engine \(profile, create kv cache, warmup model\)", None),
    ("worker_warmup", "worker's warm-up request", r"warm-up request done", None),
    ("engine_ready", "engine ready", r"engine ready in", None),
    ("first_token", "first token of the job", r"\] chunk ", None),
]
_STAMP = re.compile(r"^\[\s*([\d.]+)\] ")


def boot_phases(stamped_log: str) -> dict[str, float]:
    """Seconds from process start at which each phase of ``PHASE_MARKERS`` ended (the first line
    matching its pattern, after the line of the phase it waits for), from a log whose lines carry
    ``[seconds] `` stamps (``bench_coldstart`` writes one). Phases a boot skips (eager mode: no
    compile, no capture) are absent."""
    found: dict[str, float] = {}
    for line in stamped_log.splitlines():
        stamp = _STAMP.match(line)
        if not stamp:
            continue
        for name, _, pattern, after in PHASE_MARKERS:
            if name not in found and (after is None or after in found) and re.search(pattern, line):
                found[name] = float(stamp.group(1))
    return found


def parse_boot_log(text: str) -> dict[str, float]:
    found = {}
    for name, pattern in LOG_MARKERS.items():
        match = re.search(pattern, text)
        if match:
            found[name] = float(match.group(1))
    first_chunk = re.search(r"\[\s*([\d.]+)s\] (chunk|final)", text)  # the local test run's own timestamps
    if first_chunk:
        found["first_item_s"] = float(first_chunk.group(1))
    return found


def import_seconds(env: dict[str, str], repeats: int = 5) -> float:
    code = "import time; t = time.perf_counter(); import handler; print(time.perf_counter() - t)"
    values = [
        float(
            subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(repeats)
    ]
    return statistics.median(values)


def _weights_before_boot(env: dict[str, str], model_path: str) -> float | None:
    """The share of the model's weight files in the page cache as a boot starts, after evicting
    them when ``COLDSTART_EVICT_WEIGHTS=1`` (the cold-disk case: each boot, the handler's and vLLM
    server's alike, reads them from the disk); None where the model has no local weight files."""
    from worker.boot import prefetch

    files = prefetch.weight_files(Path(model_path))
    if not files:
        return None
    if env.get("COLDSTART_EVICT_WEIGHTS") == "1":
        for path in files:
            prefetch.evict(path)
    return round(prefetch.resident_fraction(files), 4)


def bench_coldstart(
    settings: Settings, env: dict[str, str], *, model_path: str, out: Path, with_server: bool = True
) -> dict[str, Any]:
    """The handler's boot to its first streamed token, then (``with_server``) vLLM's own server's
    to its first token, one after the other on the same caches. ``COLDSTART_EVICT_WEIGHTS=1``
    evicts the weights before each; ``COLDSTART_SERVER_CACHE_ROOT`` gives vLLM's server its own
    ``VLLM_CACHE_ROOT`` (its first boot there fills it, as the handler's fills the handler's)."""
    import httpx

    job = json.dumps({"input": {"prompt": PROMPT, "sampling_params": {"max_tokens": 8, "temperature": 0}}})
    handler_resident = _weights_before_boot(env, model_path)
    started = time.perf_counter()
    proc = subprocess.Popen(
        # --verbose: vLLM's INFO lines, which the phase table reads (a local run logs WARNING otherwise).
        [sys.executable, "handler.py", "--verbose", "--test_input", job],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(f"[{time.perf_counter() - started:8.3f}] {line}")
    proc.wait()
    exit_s = time.perf_counter() - started
    log = "".join(lines)
    (out / "coldstart-handler.log").write_text(log)
    phases = boot_phases(log)
    handler = {
        "first_token_s": phases.get("first_token"),  # the line of the job's first chunk
        "process_exit_s": exit_s,
        "breakdown": parse_boot_log(log),
        "phases_end_s": phases,
        "weights_resident_at_start": handler_resident,
    }
    if not with_server:
        return {"handler": handler, "handler_import_s": import_seconds(env)}

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = out / "coldstart-vllm-server.log"
    server_env = dict(env)
    if env.get("COLDSTART_SERVER_CACHE_ROOT"):
        server_env["VLLM_CACHE_ROOT"] = env["COLDSTART_SERVER_CACHE_ROOT"]
    server_resident = _weights_before_boot(env, model_path)
    started = time.perf_counter()
    with server_process(
        vllm_server_args(settings, model_path=model_path, port=port), env=server_env, base=base, log_path=log_path
    ) as (ready_s, _):
        timing = RequestTiming(start=time.perf_counter())

        async def first() -> None:
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"model": settings.served_model_name, "prompt": PROMPT, "max_tokens": 8, "stream": True}
                await http_stream(client, base, body, timing)

        asyncio.run(first())
        server_first = (timing.first_token or time.perf_counter()) - started
    server = {
        "ready_s": ready_s,
        "first_token_s": server_first,
        "breakdown": parse_boot_log(log_path.read_text()),
        "weights_resident_at_start": server_resident,
    }
    return {"handler": handler, "vllm_server": server, "handler_import_s": import_seconds(env)}


async def bench_first_request(
    settings: Settings, *, num_after: int = 5, idle_s: float = 1.0, pool: EnginePool | None = None
) -> dict[str, Any]:
    """TTFT of the first request after the engine boots against that of the next ``num_after``,
    each sent after ``idle_s`` of idle (serverless traffic arrives after gaps, and an idle engine
    takes a moment to wake): what lazy initialisation is left for the first user. The same for
    the first request that uses the sampler's optional kernels (penalties, top-k/top-p, min-p,
    seeded sampling; vLLM 0.32 warms them at boot only with ``kernel_config.enable_jit_warmup``
    on, the worker's warm-up request runs them), sent right after."""
    from worker.boot.launch import WARMUP_SAMPLING_FEATURES as FEATURED
    from worker.schema import parse_request

    pool = pool or EnginePool(share=False)
    engine = await pool.get(settings)

    async def ttft_ms(i: int, extra: dict[str, Any]) -> float:
        if idle_s:
            await asyncio.sleep(idle_s)
        sampling = {"max_tokens": 16, "ignore_eos": True, **extra}
        request = parse_request({"prompt": f"{PROMPT} {i}", "sampling_params": sampling})
        started = time.perf_counter()
        first: float | None = None
        async for chunk in engine.generate(request):
            if chunk.num_tokens and first is None:
                first = time.perf_counter() - started
        return (first or 0.0) * 1000

    try:
        plain = [await ttft_ms(0, {})]
        featured = [await ttft_ms(1, FEATURED)]
        for i in range(num_after):
            plain.append(await ttft_ms(2 + 2 * i, {}))
            featured.append(await ttft_ms(3 + 2 * i, FEATURED))
    finally:
        pool.release(engine)
    steady = statistics.median(plain[1:])
    featured_steady = statistics.median(featured[1:])
    return {
        "first_ttft_ms": plain[0],
        "steady_ttft_ms": steady,
        "ratio": plain[0] / steady if steady else None,
        "after_ttfts_ms": plain[1:],
        "first_featured_ttft_ms": featured[0],
        "steady_featured_ttft_ms": featured_steady,
        "featured_ratio": featured[0] / featured_steady if featured_steady else None,
        "featured_sampling": FEATURED,
        "idle_s": idle_s,
        "warmup_request": settings.warmup_request,
        "engine_args": settings.engine_args,
    }
