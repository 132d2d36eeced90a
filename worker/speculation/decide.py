"""Which of vLLM's GPU model runners an engine gets (``MODEL_RUNNER``), and whether the worker's
controller picks k per step (``SPECULATION_CONTROL``): two answers that depend on each other, since
``auto`` moves n-gram and EAGLE heads to the V2 runner, which keeps full CUDA graphs under a
batch-size schedule. Reads only the settings: imports without vLLM."""

from __future__ import annotations

from typing import Literal

from worker.config import DeploymentMode, Settings
from worker.speculation.config import drafts_by_eagle, drafts_by_ngram

__all__ = [
    "full_graphs_for_joins",
    "is_eager",
    "keeps_full_graphs",
    "model_runner_flag",
    "runs_worker_scheduler",
    "speculation_control",
]


def is_eager(settings: Settings) -> bool:
    """Eager mode, asked for or the tiny model's (it boots in seconds; compiling would take longer)."""
    return settings.enforce_eager or settings.is_tiny_default


def keeps_full_graphs(settings: Settings, *, is_cpu: bool) -> bool:
    """Whether the target runs full CUDA graphs, which V2 keeps under a schedule: a GPU, and
    neither eager mode (:func:`is_eager`, or through ENGINE_ARGS) nor a graph mode without full
    graphs."""
    eager = is_eager(settings) or bool((settings.engine_args or {}).get("enforce_eager"))
    return not is_cpu and not eager and settings.cudagraph_mode not in ("NONE", "PIECEWISE")


def runs_worker_scheduler(settings: Settings) -> bool:
    """Whether a speculating engine runs the worker's scheduler (exact stats and, under
    ``SPECULATION_CONTROL=auto``, the controller): per-request stats not turned off, and no
    scheduler of the user's through ``ENGINE_ARGS``."""
    return settings.per_request_spec_decode_metrics != "none" and "scheduler_cls" not in (settings.engine_args or {})


def _drafts_on_v2_under_auto(settings: Settings) -> bool:
    """n-gram or an EAGLE head: the drafters ``SPECULATION_CONTROL=auto`` runs on vLLM's V2 runner."""
    spec = settings.resolved_speculative_config
    return drafts_by_ngram(spec) or drafts_by_eagle(spec)


def _users_model_runner(settings: Settings) -> str | None:
    """``VLLM_USE_V2_MODEL_RUNNER`` as the user chose it (``MODEL_RUNNER``, or vLLM's own variable), else None."""
    if settings.model_runner != "auto":
        return "1" if settings.model_runner == "v2" else "0"
    return settings.vllm_use_v2_model_runner


def speculation_control(settings: Settings, *, mode: DeploymentMode, is_cpu: bool = False) -> Literal["auto", "static"]:
    """``SPECULATION_CONTROL``, or its default where unset: ``auto`` where the H200 map measured it
    at or above the static choice, and safe (n-gram on V2); ``static`` elsewhere (issue 49's runs:
    docs/benchmarks.md, and docs/gpu-results/HISTORY.md before the thirty-third):

    - the CPU build: ``static``. The controller's cost figures are a GPU's; on two cores they
      misjudged the tiny draft (``auto`` chose k = 1 and ran at 0.41x no speculation).
    - n-gram: ``auto`` moves the engine to V2 (:func:`model_runner_flag`), where it ran 2.35x no
      speculation at one stream (acceptance length 2.5) against 1.50x static on V1. So ``auto``
      where V2 runs anyway: a pod, or a runner the user set to v2. A serverless worker keeps V1 and
      ``static``, since every V2 boot pays vLLM's kernel warm-up (~30 s); so does a runner set to v1
      (``auto`` on V1 ran 1.14x), and an engine without full CUDA graphs (not measured).
    - an EAGLE head: ``static``. Under ``auto`` on V2 an EAGLE-3 head ran 2.32x at one stream and at or
      above static k = 4 at every load, but in one of two runs its engine died at 256 streams (a CUDA
      illegal memory access in vLLM 0.32's V2 runner, 154 requests left at k = 1): opt-in until that is understood.
    - a separate draft model (V1 in either case): ``static``. With the drafter's CUDA graphs a
      1B-shaped draft under ``auto`` ran 0.90-0.99x static k = 4 at 1-64 streams and 1.22x at 256,
      both below no speculation (the second run; V1 turns the target's graphs piecewise under a schedule).
    - any other method (MTP, suffix, ...), the tiny default (the figures are an 8B's), and an engine
      without the worker's scheduler (``PER_REQUEST_SPEC_DECODE_METRICS=none``, a ``scheduler_cls``),
      where no controller would answer the schedule: ``static``.
    """
    if settings.speculation_control is not None:
        return settings.speculation_control
    spec = settings.resolved_speculative_config
    # No controller without the worker's scheduler: a schedule alone would only cost V1 its full graphs.
    if is_cpu or settings.is_tiny_default or not runs_worker_scheduler(settings):
        return "static"
    if not drafts_by_ngram(spec):
        return "static"  # draft models and EAGLE heads (above), and the methods not measured (MTP, suffix, ...)
    users = _users_model_runner(settings)
    if users is not None:
        return "auto" if users == "1" and keeps_full_graphs(settings, is_cpu=is_cpu) else "static"
    return "auto" if mode == "pod" and keeps_full_graphs(settings, is_cpu=is_cpu) else "static"


def model_runner_flag(settings: Settings, *, mode: DeploymentMode, is_cpu: bool = False) -> str | None:
    """vLLM's ``VLLM_USE_V2_MODEL_RUNNER`` for ``MODEL_RUNNER`` (unset: vLLM decides, V2 on a GPU).

    Measured on an H200 with vLLM 0.32, 8B shape (docs/benchmarks.md): the V1 runner booted to the
    first token in 47.6 s with warm caches against 77.6 s for V2, which spends 24-34 s of every
    compiled boot warming kernels, caches or not; decode through AsyncLLM was +1.4% / +0.7% /
    -2.1% at 1 / 64 / 256 streams (3 runs), the handler path -6.7% at 256. With a draft model V1 decoded
    1.8x-2.3x faster (V2 runs the draft without CUDA graphs). Serverless pays every boot and
    serves small batches: V1. Pods boot once and run large batches: V2, unless a draft model.
    n-gram stays on V2 in pods: on output that loops, V2's GPU proposer (drafting from the latest
    earlier match) drafted only the loop's period and decoded 1.4-1.6x slower than V1 (drafting from
    the earliest), but where a span occurs once earlier both draft the same and V2's step was ~7%
    cheaper at 256 streams; ``MODEL_RUNNER=v1`` is the setting for looping output. n-gram and EAGLE
    heads under ``SPECULATION_CONTROL=auto`` run on V2 in both modes, on a GPU with CUDA graphs (below).
    """
    users = _users_model_runner(settings)  # MODEL_RUNNER, else vLLM's own variable
    if users is not None:
        return users
    if settings.draft_ref is not None:
        return "0"
    is_auto = speculation_control(settings, mode=mode, is_cpu=is_cpu) == "auto"
    if is_auto and keeps_full_graphs(settings, is_cpu=is_cpu) and _drafts_on_v2_under_auto(settings):
        # Under a batch-size schedule the V1 runner turns the target's full CUDA graphs piecewise
        # ("for reliability"); V2 keeps them. On an H200 (8B, n-gram k = 4, synthetic acceptance
        # 2.5, the schedule of ``auto_schedule``, ngram_gpu) auto on V2 ran 2.40x / 2.17x / 1.97x /
        # 1.74x no speculation at 1 / 8 / 32 / 64 streams; on V1 (an earlier run) 1.14x / 1.06x /
        # 0.99x at 1 / 8 / 64. An EAGLE-3 head for the 8B shape (acceptance length 3.0 at k = 4) under
        # auto: 2.32x / 2.15x / 2.08x / 1.89x / 1.39x / 1.10x at 1-256 streams on V2, 0.76x-1.00x on
        # V1 (docs/gpu-results/HISTORY.md). V2's costs stay: its kernel warm-up at every boot, and its n-gram
        # proposer's shorter drafts on looping output. Not for a separate draft model (above).
        return "1"
    if mode == "serverless":
        return "0"
    return None


def full_graphs_for_joins(settings: Settings, *, mode: DeploymentMode, is_cpu: bool = False) -> bool:
    """Whether ``CUDAGRAPH_MODE=auto`` means vLLM's FULL (a full CUDA graph for a step that carries
    a prompt too) instead of vLLM's FULL_AND_PIECEWISE: n-gram under ``SPECULATION_CONTROL=auto`` on
    the V2 runner, where the worker chose V2 or the user did.

    On an H200 (8B, V2, a mixed wave whose requests end unevenly, as traffic's do) a step that a
    request joined ran on vLLM's piecewise graphs, at 1.46-1.65x the cost model's decode step
    without speculation (about 1.6x the measured ones), and under FULL at 0.96-0.97x (about 1.04x);
    ``auto`` went from 1.01x / 0.74x the best static choice at 64 / 128 streams to 1.00x / 1.05x,
    and ran 1.03x / 0.98x at 32 / 256. On waves that start together (decode alone) vLLM's FULL
    decoded within 2% at 1-8 streams and 2.5-6% slower at 64-256 without speculation: it replays
    graphs planned for prompts on decode steps. So where this is true the worker's plugin adds
    vLLM's decode graphs (``worker.vllm_plugin``), and speculation switched off then ran 1.02x /
    0.99x no speculation at 64 / 256 streams, for a capture of 19 s instead of 5
    (docs/gpu-results/HISTORY.md, the twenty-first to thirty-second runs; 0.98-1.01x at 1-256 in
    the thirty-third, docs/benchmarks.md). Not measured: an EAGLE head's or a draft model's graphs
    under FULL, the V1 runner on uneven traffic, and an engine without the worker's controller;
    those keep vLLM's mode, as does an engine without speculation (``CUDAGRAPH_MODE=FULL`` is the
    setting). FULL over an attention backend with full graphs for decode only (FlashAttention 2:
    A100, L40S) falls back to vLLM's mode by vLLM's own rule, and over one with none (Llama 4's
    chunked local attention) by the worker's plugin (``worker.vllm_plugin``).
    """
    if settings.cudagraph_mode != "auto" or not keeps_full_graphs(settings, is_cpu=is_cpu):
        return False
    if not runs_worker_scheduler(settings):
        return False  # no controller: measured only with one
    if not drafts_by_ngram(settings.resolved_speculative_config):
        return False
    is_auto = speculation_control(settings, mode=mode, is_cpu=is_cpu) == "auto"
    return is_auto and model_runner_flag(settings, mode=mode, is_cpu=is_cpu) == "1"
