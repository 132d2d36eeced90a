"""What a local run (``python handler.py`` without ``--verbose``) leaves out of its standard error:
the lines of vLLM, torch and transformers that ask nothing of the user, each in :data:`SILENCED`
with why. Everything else stays: the worker's own lines, and any other warning, which is the kind
that needs the user's action (a new one shows until it is judged and listed here).

Each entry names where the line comes from and how its message starts: a logger's record (a filter
on that logger, which the engine's forked processes inherit), a Python warning (a filter in
``warnings``), or a warning of torch's C++ layer, which no Python filter sees: those are left out by
``TORCH_CPP_LOG_LEVEL``, set before torch loads (``worker.config.local_run_environment``), all of
that layer's warnings and not only the one listed. vLLM's INFO lines are left out by its level (set
there too); this module also holds vLLM's loggers to that level before vLLM configures its own
logging, which it does only when the engine's configuration is built. vLLM's progress bar for
loading the weights is turned off by a setting (``LOAD_PROGRESS``, which the local run sets
false). ``--verbose`` silences nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import warnings
from typing import Literal

__all__ = ["SILENCED", "Silenced", "silence"]

_CPU_BUILD = "vLLM's CPU build, which serves the tests and the default model's demo, not traffic"


@dataclasses.dataclass(frozen=True, slots=True)
class Silenced:
    """A line left out: from ``source`` (a logger's name; a warning category's for ``kind``
    "warning"; "torch-c++"), its message starting with ``message``, and why no action is needed."""

    kind: Literal["log", "warning", "torch-c++"]
    source: str
    message: str
    why: str


SILENCED: tuple[Silenced, ...] = (
    Silenced(
        "log",
        "vllm.config.vllm",
        "Async scheduling not supported with ngram-based speculative decoding",
        "the default set-up's n-gram on the CPU build, which has no async scheduling to lose",
    ),
    Silenced(
        "log",
        "vllm.config.vllm",
        "Enforce eager set, disabling torch.compile",
        "the plan's choice (the embedded models boot faster eager on the CPU) or ENFORCE_EAGER, the user's own",
    ),
    Silenced(
        "log",
        "vllm.config.vllm",
        "Inductor compilation was disabled by user settings",
        "follows from eager mode, above",
    ),
    Silenced(
        "log",
        "vllm.config.vllm",
        "max_num_scheduled_tokens is set to",
        "vLLM warns below 8,192 with any speculation; the worker's serverless default (2,048 tokens a step) "
        "holds a decode step of MAX_NUM_SEQS x (1 + k) tokens, and a larger prompt is chunked",
    ),
    Silenced(
        "log",
        "vllm.config.vllm",
        "Model Runner V2 requires Triton",
        f"{_CPU_BUILD}: it runs its own runner (the served block says model_runner=cpu)",
    ),
    Silenced("log", "vllm.platforms.cpu", "Triton is not installed", f"{_CPU_BUILD}: it ships without Triton"),
    Silenced(
        "log",
        "vllm.platforms.cpu",
        "Reset SSM cache type to float32",
        "about Mamba's cache, which none of the models served here has",
    ),
    Silenced(
        "log",
        "vllm.v1.worker.cpu_worker",
        "libtcmalloc is not found in LD_PRELOAD",
        f"{_CPU_BUILD}: a faster allocator would speed it up, not change what it answers",
    ),
    Silenced(
        "log",
        "vllm.v1.worker.cpu_worker",
        "libiomp is not found in LD_PRELOAD",
        f"{_CPU_BUILD}: Intel's OpenMP would speed it up, not change what it answers",
    ),
    Silenced(
        "log",
        "vllm.v1.worker.cpu_worker",
        "Speculative decoding on CPU without Intel OpenMP",
        f"{_CPU_BUILD}: the same as libiomp's, above",
    ),
    Silenced(
        "log",
        "vllm.v1.sample.logits_processor",
        "min_p and logit_bias parameters won't work with speculative decoding",
        "a request that asks for them while speculating is refused with an error that says so",
    ),
    Silenced(
        "log",
        "vllm.config.scheduler",
        "Using custom scheduler class",
        "the worker's own scheduler (the exact per-request stats), kept under the seam's contract",
    ),
    Silenced(
        "log",
        "vllm.config.model",
        "Default vLLM sampling parameters have been overridden by the model's `generation_config.json`",
        "the worker applies the model's defaults on purpose (the README: greedy on the embedded models)",
    ),
    Silenced(
        "log",
        "transformers.generation.configuration_utils",
        "The following generation flags are not valid and may be ignored",
        "the model's generation_config.json as published (SmolLM2's sets a temperature for greedy decoding)",
    ),
    Silenced(
        "log",
        "torch._library.triton",
        "Triton not available",
        f"{_CPU_BUILD}: torch says the same as vLLM, above",
    ),
    Silenced(
        "warning",
        "FutureWarning",
        "`torch.distributed.reduce_op` is deprecated",
        "vLLM's own code touching torch's deprecated name while it scans modules; nothing of the worker's",
    ),
    Silenced(
        "torch-c++",
        "torch-c++",
        "NUMA binding: Using MEMBIND policy",
        f"{_CPU_BUILD}: where its memory is placed, for information",
    ),
)


class _Drop(logging.Filter):
    """Drops a logger's records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def silence(*, vllm_level: str | None) -> None:
    """Leave :data:`SILENCED` out of this process and the engine processes it forks (call it before
    vLLM is imported). ``vllm_level``: the level vLLM's own logging will use, held from now on (None:
    the root logger's until vLLM configures its own)."""
    by_logger: dict[str, list[str]] = {}
    for entry in SILENCED:
        if entry.kind == "log":
            by_logger.setdefault(entry.source, []).append(entry.message)
        elif entry.kind == "warning":
            category = {"FutureWarning": FutureWarning, "DeprecationWarning": DeprecationWarning}[entry.source]
            warnings.filterwarnings("ignore", message=re.escape(entry.message), category=category)
    for name, starts in by_logger.items():
        logging.getLogger(name).addFilter(_Drop(tuple(starts)))
    # Until vLLM configures its logging (when the engine's configuration is built), its records go
    # to the root logger at the root's level: vLLM's own level holds from the start.
    if vllm_level is not None:
        logging.getLogger("vllm").setLevel(vllm_level)
