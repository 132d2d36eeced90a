"""The worker's vLLM general plugin (entry point ``vllm.general_plugins`` in pyproject.toml): vLLM
calls ``register`` in every process it runs, the engine core and each model worker included, and
spawned ones too.

What it does: asks Linux for the AMX tile registers before vLLM's CPU kernels use them. vLLM's CPU
attention picks its AMX kernel whenever the CPU reports AMX (``_get_attn_isa`` in
``vllm/v1/attention/backends/cpu_attn.py``) but never requests the permission Linux requires for it
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``), so on a Sapphire Rapids or newer Xeon the
first bf16 forward pass dies with "Illegal instruction" (seen on 2026-12-03: the tiny model's first
job). The permission is per process, kept across fork and dropped by exec, hence a plugin that
runs in each process rather than one call at the worker's start. PyTorch's ``torch.cpu._init_amx``
makes that request (it is what its own oneDNN path calls); nothing public does, so it is called
here, where present, and only on a CPU that reports AMX tiles. vLLM loads every installed plugin
unless ``VLLM_PLUGINS`` names some: a list without ``runpod_worker`` leaves this one out.

And, where the worker chose vLLM's FULL CUDA-graph mode by default (``FULL_GRAPHS_ENV``, set by the
boot plan: n-gram under ``SPECULATION_CONTROL=auto`` on V2, ``worker/speculation/decide.py``), it keeps
vLLM's own fallback for an attention backend that supports no full graphs at all (Llama 4's chunked
local attention, a composite backend over an unclamped window: ``AttentionCGSupport.NEVER``).
vLLM's default mode falls back to piecewise graphs there, but FULL raises ("please try
cudagraph_mode=PIECEWISE") in the model runner, after the engine core has started, where the
worker cannot change the mode; the mode is resolved per process, hence here. A backend that
supports full graphs for decode only already falls back from FULL to vLLM's default mode by itself.

There too, it gives FULL the uniform-decode graphs vLLM's default mode captures
(``_capture_decode_graphs_under_full``). vLLM's V2 runner captures FULL's graphs for batches that
may carry a prompt, with the attention planned for a query as long as the batch
(``prepare_inputs_to_capture``: ``max_query_len = num_tokens``), and replays them for decode too,
so decode alone ran slower under FULL than under vLLM's default mode, whose decode graphs are
planned for the decode's query length. vLLM has no mode of full graphs for both (``CUDAGraphMode``
pairs FULL decode graphs with piecewise or no mixed ones), hence here. What they cost and gain
(capture time, memory, decode speed with speculation switched off):
docs/gpu-results/HISTORY.md, "FULL's decode graphs".

And it keeps the heap frozen through vLLM's CUDA-graph capture, so that the full collections after it
skip what the boot froze (``worker.vllm_internals.capture_heap``).

And where the boot plan says a draft model skips its pass at k = 0 (``DRAFT_SKIP_ENV``: a draft
model on vLLM 0.34's V2 runner), it names the seam's speculator as the one vLLM builds for
``draft_model`` (``worker.vllm_internals.draft_skip``); vLLM resolves a speculator class by its
qualified name in the engine core, hence here, in every process.

Every vLLM name this module touches is in the seam's contract (``worker.vllm_internals.contract``).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from worker.vllm_internals.capture_heap import keep_heap_frozen_through_capture

__all__ = [
    "DRAFT_SKIP_ENV",
    "FULL_GRAPHS_ENV",
    "apply_draft_skip",
    "apply_full_graph_choices",
    "is_wrapped",
    "register",
]

log = logging.getLogger(__name__)

FULL_GRAPHS_ENV = "RUNPOD_WORKER_FULL_GRAPHS_BY_DEFAULT"
DRAFT_SKIP_ENV = "RUNPOD_WORKER_DRAFT_SKIP"
_SKIPPING_SPECULATOR = "worker.vllm_internals.draft_skip.SkippingDraftSpeculator"
# Marks the worker's wrappers of vLLM's methods (in the wrapper's own __dict__), so that a process
# wraps each method once.
_WRAPPED = "runpod_worker_wrapper"


def is_wrapped(method: Any) -> bool:
    return bool(vars(method).get(_WRAPPED))


def register() -> None:
    apply_full_graph_choices()
    apply_draft_skip()
    keep_heap_frozen_through_capture()
    _request_amx_tiles()


def apply_full_graph_choices() -> None:
    """Where this process's environment says the worker chose FULL (``FULL_GRAPHS_ENV``), wrap
    vLLM's methods for it (module docstring); the wrappers ask the marker again at each call.

    vLLM calls ``register`` once a process, and an engine core forked from a process that loaded
    the plugins before its boot plan set the marker inherits vLLM's classes unwrapped (a second
    engine in one process: the spec map's engines side by side). So the boot calls this too, once
    the plan's environment is set (``worker.boot.launch.build_config``); a later engine of that
    process without the marker gets vLLM's own behaviour from the same wrappers. The boot plan also
    marks such an engine's vLLM config (``worker.boot.engine_args.FULL_GRAPHS_CONFIG``), since vLLM keys its
    startup plan (the KV cache it reserves beside the graphs) and compile cache by that config."""
    if os.environ.get(FULL_GRAPHS_ENV) != "1":
        return
    _fall_back_from_full_graphs()
    _capture_decode_graphs_under_full()
    from worker.vllm_internals.check import require_internals

    require_internals()  # what the wraps rely on, now imported, is the contract's (once a process)


def apply_draft_skip() -> None:
    """Where this process's environment says so (``DRAFT_SKIP_ENV``), vLLM builds the seam's
    :class:`~worker.vllm_internals.draft_skip.SkippingDraftSpeculator` for a draft model (module
    docstring); else vLLM's own. Called by ``register`` and, like :func:`apply_full_graph_choices`,
    by the boot once the plan's environment is set."""
    is_wanted = os.environ.get(DRAFT_SKIP_ENV) == "1"
    if not is_wanted and not _VLLM_SPECULATOR:
        return  # nothing to put back: vLLM's speculator modules stay unimported
    from worker.vllm_internals.variants import draft_speculator_config

    config = draft_speculator_config()
    if config is None:
        return
    _VLLM_SPECULATOR.setdefault(id(config), config.speculator_class)
    config.speculator_class = _SKIPPING_SPECULATOR if is_wanted else _VLLM_SPECULATOR[id(config)]


# vLLM's own speculator class name, by config class, kept when the seam's replaces it (a later
# engine of the process without the marker gets vLLM's back).
_VLLM_SPECULATOR: dict[int, str] = {}


def _fall_back_from_full_graphs() -> None:
    """Wrap vLLM's ``CompilationConfig.resolve_cudagraph_mode_and_sizes`` so that FULL over a backend
    without full graphs resolves as vLLM's default mode would (module docstring). Once a process."""
    from vllm.config.compilation import CompilationConfig, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    resolve = CompilationConfig.resolve_cudagraph_mode_and_sizes
    if is_wrapped(resolve):
        return

    @functools.wraps(resolve)
    def resolve_or_fall_back(self: CompilationConfig, min_cg_support: Any, *args: Any, **kwargs: Any) -> Any:
        chosen = os.environ.get(FULL_GRAPHS_ENV) == "1"
        if chosen and self.cudagraph_mode == CUDAGraphMode.FULL and min_cg_support == AttentionCGSupport.NEVER:
            log.warning(
                "CUDA graphs: the attention backend %s supports no full graphs; vLLM's default mode instead of FULL",
                args[0] if args else kwargs.get("min_cg_attn_backend"),
            )
            self.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
        return resolve(self, min_cg_support, *args, **kwargs)

    resolve_or_fall_back.__dict__[_WRAPPED] = True
    CompilationConfig.resolve_cudagraph_mode_and_sizes = resolve_or_fall_back  # type: ignore[method-assign]


def _capture_decode_graphs_under_full() -> None:
    """Wrap the V2 runner's ``ModelCudaGraphManager._init_candidates`` so that under FULL it also
    captures vLLM's uniform-decode graphs (those of FULL_DECODE_ONLY: one per decode query length
    its speculation schedule has) and dispatches a batch of one query length to the smallest of
    its own that holds it, where one does (``_decode_candidates``); a batch that carries a prompt,
    or is larger than its decode graphs, replays FULL's (module docstring). Once a process."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    init = ModelCudaGraphManager._init_candidates
    if is_wrapped(init):
        return

    @functools.wraps(init)
    def init_with_decode_graphs(self: Any) -> None:
        if self.cudagraph_mode != CUDAGraphMode.FULL or os.environ.get(FULL_GRAPHS_ENV) != "1":
            return init(self)
        self.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        try:
            init(self)  # vLLM's decode graphs alone, as its own mode builds them
        finally:
            self.cudagraph_mode = CUDAGraphMode.FULL
        decode_descs = self._capture_descs.get(CUDAGraphMode.FULL, [])
        self._candidates, self._capture_descs = {}, {}
        init(self)  # FULL's own
        if not decode_descs:
            return None
        mixed_descs = self._capture_descs.get(CUDAGraphMode.FULL, [])
        # A list, not a set: every tensor-parallel rank must capture in the same order (a graph
        # holds its collectives), and a set's order follows each process's hash seed.
        descs = decode_descs + [d for d in mixed_descs if d not in decode_descs]
        descs.sort(key=lambda d: d.num_tokens, reverse=True)  # stable: vLLM's order, largest first
        self._capture_descs[CUDAGraphMode.FULL] = descs
        for key, decode in _decode_candidates(decode_descs).items():
            self._candidates[key] = decode + [d for d in self._candidates.get(key, []) if d not in decode]
        return None

    init_with_decode_graphs.__dict__[_WRAPPED] = True
    ModelCudaGraphManager._init_candidates = init_with_decode_graphs  # type: ignore[method-assign]


def _decode_candidates(decode_descs: list[Any]) -> dict[tuple[int, int], list[Any]]:
    """By (token count, LoRA case): for each query length (and microbatch split) the smallest decode
    graph that holds that many tokens, smallest first; the dispatch takes the first that matches.

    Written here because vLLM's own grouping (``_init_candidates``) gives a token count only the
    graphs of the smallest size at or above it, whatever their query length. Under a schedule of
    several k its decode graphs of one query length then miss batches of another (3 sequences at
    k = 0 meet the 3-token graph of k = 2 and none of their own), which vLLM's default mode runs
    piecewise and FULL on its prompt-carrying graphs."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for desc in decode_descs:
        key = (desc.num_active_loras, desc.uniform_token_count, desc.max_query_len, desc.num_ubatches)
        groups.setdefault(key, []).append(desc)
    candidates: dict[tuple[int, int], list[Any]] = {}
    for (loras, *_), group in groups.items():
        start = 0
        for desc in sorted(group, key=lambda d: d.num_tokens):
            for tokens in range(start, desc.num_tokens + 1):
                candidates.setdefault((tokens, loras), []).append(desc)
            start = desc.num_tokens + 1
    for listed in candidates.values():
        listed.sort(key=lambda d: d.num_tokens)
    return candidates


def _request_amx_tiles() -> None:
    import torch

    cpu = getattr(torch, "cpu", None)
    is_supported = getattr(cpu, "_is_amx_tile_supported", None)
    init = getattr(cpu, "_init_amx", None)
    if is_supported is None or init is None or not is_supported():
        return
    if not init():
        # vLLM will still choose its AMX kernel: say why the process is about to die.
        log.error("this CPU reports AMX tiles but Linux refused them to this process: vLLM's AMX kernels will fail")
