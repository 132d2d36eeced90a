"""The GPU benchmark's stages, as data: each a name, what it answers, its settings and its runs
(a bench program with its arguments), in ``STAGES``; :func:`command` makes a run concrete.
:mod:`.stage_runner` runs them (``python -m worker bench --stage NAME``).

Settings, lowest first: the environment, the checkpoints' (the shapes: dummy weights, 4,096
tokens, 256 sequences), the stages' common ones (the target, no speculation), the stage's, the
run's (a run's ``speculation`` is a configuration of :mod:`.spec_map`'s grammar, made into
vLLM's speculative config the same way), then the runner's ``--set NAME=VALUE``. Arguments given
to the runner after ``--`` go to every run's program after the stage's own (argparse keeps the
last value of a flag). In settings and arguments, ``$target``, ``$draft``, ``$eagle3``, ``$awq``,
``$target70b`` and ``$real`` name the checkpoints (Llama-3 shapes of :mod:`.shapes`, made on
first use), ``$scratch`` a folder of the stage's own that starts empty (cache roots), and
``$out`` the run's folder.

At smoke sizes the runs take the tiny models (``tiny:target``, the noisy draft ``tiny:noisy``) and
the standard rejection sampler in place of vLLM's synthetic one (GPU only): they check the
harness, not speed. A stage whose checkpoints have no tiny stand-in, or that needs a GPU for
another reason, has no smoke run and says why.

The engines are vLLM 0.34's V2 runner (its only GPU runner). A run's result files go under
docs/gpu-results/, which docs/benchmarks.md is rendered from (its "Adding a run").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import ClassVar

from worker.tools.bench.spec_map_config import config_env

__all__ = [
    "SHAPES",
    "STAGES",
    "TINY",
    "Bench",
    "Checkpoints",
    "Command",
    "Run",
    "Script",
    "SpecMap",
    "Stage",
    "command",
    "placeholders",
    "real_sampler",
]

ROOT = Path(__file__).resolve().parents[3]
Env = Mapping[str, str | None]  # a setting's value, or None: unset


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(value) for value in values)


def real_sampler(config: str) -> str:
    """A speculation map configuration (``DRAFTER:K:LENGTH:CONTROL[+KEY=VALUE...]``) with the
    standard rejection sampler in place of a synthetic acceptance length (a GPU-only sampler)."""
    name, plus, extra = config.partition("+")
    if name == "none":
        return config
    drafter, k, _length, control = name.rsplit(":", 3)
    return f"{drafter}:{k}:real:{control}{plus}{extra}"


# ------------------------------------------------------------------------------ programs
@dataclass(frozen=True, slots=True)
class Bench:
    """``python -m worker bench`` with these arguments (two waves of requests per level)."""

    parts: tuple[str, ...]
    concurrency: tuple[int, ...] = (1, 8, 64, 256)
    repeats: int = 3
    max_tokens: int = 256
    stats_off_baseline: bool = False
    lossless_samples: int | None = None
    lossless_top_p: bool = False
    result: ClassVar[str] = "bench.json"

    def argv(self, *, label: str, smoke: bool, gpu: str | None) -> list[str]:
        argv = ["-m", "worker", "bench", "--out", "$out", "--label", label, "--parts", ",".join(self.parts)]
        argv += ["--concurrency", _ints(self.concurrency), "--repeats", str(self.repeats)]
        argv += ["--max-tokens", str(self.max_tokens), "--num-requests", "0"]
        argv += ["--gpu", gpu] if gpu else []
        argv += ["--stats-off-baseline"] if self.stats_off_baseline else []
        argv += ["--lossless-samples", str(self.lossless_samples)] if self.lossless_samples else []
        # A speculating CPU engine dies on top-p: the smoke run keeps temperature 1 alone.
        argv += ["--lossless-top-p"] if self.lossless_top_p and not smoke else []
        return [*argv, "--smoke"] if smoke else argv


@dataclass(frozen=True, slots=True)
class SpecMap:
    """``python -m worker.tools.bench.spec_map``: the configurations side by side, one engine each."""

    configs: tuple[str, ...]
    concurrency: tuple[int, ...] = (1, 8, 32, 64, 128, 256)
    max_tokens: int = 128
    repeats: int = 3
    deadline_s: int = 400  # no repeat starts after it
    result: ClassVar[str] = "spec_map.json"

    def argv(self, *, label: str, smoke: bool, gpu: str | None) -> list[str]:
        # At smoke sizes configurations differing only in their synthetic length are one.
        configs = list(dict.fromkeys(real_sampler(config) for config in self.configs)) if smoke else list(self.configs)
        concurrency, max_tokens, repeats = (
            ((1, 2), 16, 1) if smoke else (self.concurrency, self.max_tokens, self.repeats)
        )
        return [
            *("-m", "worker.tools.bench.spec_map", "--out", "$out", "--configs", ";".join(configs)),
            *("--concurrency", _ints(concurrency), "--max-tokens", str(max_tokens), "--repeats", str(repeats)),
            *("--deadline-s", str(self.deadline_s)),
        ]


@dataclass(frozen=True, slots=True)
class Script:
    """A Python script or ``-c`` program: ``args`` after the interpreter (``$out``: the run's folder)."""

    args: tuple[str, ...]
    result: str = ""

    def argv(self, *, label: str, smoke: bool, gpu: str | None) -> list[str]:
        return list(self.args)


Program = Bench | SpecMap | Script


# ------------------------------------------------------------------------------ stages
@dataclass(frozen=True, slots=True)
class Run:
    """One program run: ``label`` names what it writes (module docstring). ``speculation``: a
    speculation map configuration for the run's engines; ``warm_weights``: the checkpoint's weight
    files read into the page cache first; ``min_s``: under ``--time-limit``, skipped when less is left."""

    label: str
    program: Program
    env: Env = field(default_factory=dict)
    speculation: str | None = None
    warm_weights: bool = False
    min_s: int = 60


@dataclass(frozen=True, slots=True)
class Stage:
    """A named list of runs; ``gpu_only``: why it has no smoke run beyond its checkpoints ('': none)."""

    name: str
    about: str
    runs: tuple[Run, ...]
    env: Env = field(default_factory=dict)
    num_gpus: int = 1
    gpu_only: str = ""

    def checkpoints(self) -> set[str]:
        """The checkpoints the stage's runs name (after the common settings and its own)."""
        names: set[str] = set()
        for run in self.runs:
            texts = [*_layers(self, run).values(), run.speculation or ""]
            texts += run.program.argv(label=run.label, smoke=False, gpu=None)
            names |= {name for text in texts if text for name in placeholders(text)}
        return names & set(SHAPES)

    def no_smoke(self) -> str:
        """Why the stage has no smoke run ('': it has one)."""
        missing = sorted(self.checkpoints() - set(TINY))
        if missing:
            return f"no tiny stand-in for {', '.join('$' + name for name in missing)}"
        return self.gpu_only


# Placeholder -> (folder under --models, the shape made there by shapes.make_shape_model, AWQ config).
SHAPES: dict[str, tuple[str, str, bool]] = {
    "target": ("llama8b", "llama-3-8b", False),
    "draft": ("llama8b-1b", "llama-3.2-1b", False),
    "eagle3": ("llama8b-eagle3", "eagle3-llama-3-8b", False),
    "awq": ("llama8b-awq", "llama-3-8b", True),
    "target70b": ("llama70b", "llama-3-70b", False),
    "real": ("llama8b-real", "llama-3-8b", False),  # with real-size random weights (16 GB)
}
TINY = {"target": "tiny:target", "draft": "tiny:noisy", "real": "tiny:target"}
COMMON_ENV: dict[str, str | None] = {"MODEL_NAME": "$target", "SPECULATIVE_METHOD": "none"}
SHAPES_ENV: dict[str, str | None] = {"LOAD_FORMAT": "dummy", "MAX_MODEL_LEN": "4096", "MAX_NUM_SEQS": "256"}
NGRAM4: dict[str, str | None] = {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4"}
WIDE: dict[str, str | None] = {"MAX_NUM_SEQS": "512", "MAX_QUEUE_DEPTH": "512"}  # 512 streams, no 429
REAL_WEIGHTS: dict[str, str | None] = {
    "MODEL_NAME": "$real",
    "LOAD_FORMAT": "auto",
    "MAX_NUM_SEQS": "128",
    "VLLM_CACHE_ROOT": "$scratch/root",
    "COLDSTART_SERVER_CACHE_ROOT": "$scratch/server-root",
}


def _map(name: str, about: str, *configs: str, gpu_only: str = "") -> Stage:
    return Stage(name, about, (Run(name, SpecMap(configs), min_s=120),), gpu_only=gpu_only)


def _overhead(label: str, concurrency: tuple[int, ...], **env: str | None) -> Run:
    return Run(label, Bench(("overhead", "roofline"), concurrency), env=env)


STAGES: dict[str, Stage] = {
    stage.name: stage
    for stage in [
        Stage("overhead", "the handler's path against raw AsyncLLM, bf16", (_overhead("bf16", (1, 8, 64, 256)),)),
        Stage(
            "ceiling",
            "the same at 256 and 512 streams: raw AsyncLLM is the engine's ceiling for any server",
            (_overhead("ceiling", (256, 512)),),
            env=WIDE,
        ),
        Stage(
            "fp8",
            "the handler's path against raw AsyncLLM, fp8",
            (_overhead("fp8", (1, 64, 256), QUANTIZATION="fp8"),),
            gpu_only="fp8 kernels",
        ),
        *[
            Stage(
                f"quant-{kernel}",
                f"AWQ 4-bit with the {kernel.capitalize()} kernel, handler against raw AsyncLLM",
                (_overhead(f"awq-{kernel}", (1, 256), MODEL_NAME="$awq", AWQ_KERNEL=kernel),),
            )
            for kernel in ("marlin", "machete")
        ],
        Stage(
            "pod",
            "the pod against vLLM's OpenAI server, the same API process count, booted side by side",
            (Run("pod", Bench(("pod",))),),
        ),
        Stage(
            "pod-vs-serve",
            "the pod (two API processes) against `vllm serve` as launched by default (one), 64-512 streams",
            (Run("pod-vs-serve", Bench(("pod",), (64, 256, 512))),),
            env={**WIDE, "API_SERVER_COUNT": "2", "POD_BENCH_BASELINE": "vllm1"},
        ),
        Stage(
            "pod-spec",
            "the pod against vLLM's server, both with the 1B-shaped draft (static k = 3, synthetic L = 2.5)",
            (Run("pod-spec", Bench(("pod",), (1, 8, 32, 64, 128, 256), repeats=2), speculation="$draft:3:2.5:static"),),
        ),
        _map(
            "spec-map-ngram",
            "where n-gram speculation pays: static k = 2 and auto at L = 2.5, auto at 0%, against none",
            "none",
            "ngram_gpu:2:2.5:static",
            "ngram:4:2.5:auto",
            "ngram:4:1.0:auto",
            gpu_only="ngram_gpu, V2's n-gram proposer on the GPU",
        ),
        _map(
            "spec-map-draft",
            "where a 1B-shaped draft pays: auto and static k = 3 at L = 2.5, against none",
            "none",
            "$draft:3:2.5:auto",
            "$draft:3:2.5:static",
        ),
        _map(
            "spec-map-eagle3",
            "where an EAGLE-3 head pays: auto and static k = 3 at L = 2.5, against none",
            "none",
            "$eagle3:3:2.5:auto",
            "$eagle3:3:2.5:static",
        ),
        Stage(
            "coldstart",
            "the handler's boot to its first token: an empty cache root, then a warm one beside vLLM's server",
            (
                Run("cold-empty-root", Bench(("coldstart_handler",))),
                Run("cold-warm-root", Bench(("coldstart",))),
            ),
            env={"VLLM_CACHE_ROOT": "$scratch/root"},
        ),
        Stage(
            "coldstart-real",
            "real-size weights, the handler and vLLM's server each on its own root: empty roots, "
            "then warm roots with the weights in the page cache, then evicted (a cold disk)",
            (
                Run("cold-real-empty", Bench(("coldstart",)), warm_weights=True, min_s=160),
                Run("cold-real-cache", Bench(("coldstart",)), warm_weights=True, min_s=100),
                Run("cold-real-disk", Bench(("coldstart",)), env={"COLDSTART_EVICT_WEIGHTS": "1"}, min_s=95),
            ),
            env=REAL_WEIGHTS,
        ),
        Stage(
            "stats-ngram",
            "the cost of exact stats, n-gram k = 4: the handler over engines with and without them",
            (Run("stats-ngram4", Bench(("overhead",), stats_off_baseline=True), env=NGRAM4),),
        ),
        Stage(
            "stats-draft",
            "the same with the 1B-shaped draft, k = 4 (64 tokens: dummy weights accept nothing)",
            (
                Run(
                    "stats-draft1b4",
                    Bench(("overhead",), stats_off_baseline=True, max_tokens=64),
                    env={
                        "SPECULATIVE_METHOD": "draft_model",
                        "SPECULATIVE_MODEL": "$draft",
                        "NUM_SPECULATIVE_TOKENS": "4",
                    },
                ),
            ),
        ),
        Stage(
            "stats-path",
            "the exact-stats path's own CPU time per engine step, against an n-gram k = 4 engine's step",
            (Run("stats-path", Bench(("overhead", "stats_path"), repeats=1), env=NGRAM4),),
        ),
        Stage(
            "lossless",
            "is speculation lossless at temperature > 0: the tiny models with and without it, token by token",
            (Run("lossless", Bench(("lossless",), (256,), lossless_samples=1000, lossless_top_p=True)),),
            env={"MODEL_NAME": "tiny:target", "LOAD_FORMAT": None, "MAX_MODEL_LEN": None},
        ),
        *[
            Stage(
                f"tp2-70b{suffix}",
                f"a Llama-3-70B shape in {quant or 'bf16'} on two GPUs, n-gram k = 4: handler against raw AsyncLLM",
                (Run(f"tp2-70b{suffix}", Bench(("overhead",), (1, 64, 256))),),
                env={"MODEL_NAME": "$target70b", "TENSOR_PARALLEL_SIZE": "2", "QUANTIZATION": quant or None, **NGRAM4},
                num_gpus=2,
                gpu_only="two GPUs",
            )
            for suffix, quant in (("", ""), ("-fp8", "fp8"))
        ],
        Stage(
            "tp2-8b",
            "the 8B shape on two GPUs, no speculation: against the overhead stage's one",
            (Run("tp2-8b", Bench(("overhead",), (1, 256))),),
            env={"TENSOR_PARALLEL_SIZE": "2"},
            num_gpus=2,
            gpu_only="two GPUs",
        ),
        Stage(
            "tp2-faults",
            "scripts/gpu_faults.py on the 70B shape (eager): faults with two GPUs",
            (Run("tp2-faults", Script(("scripts/gpu_faults.py", "$out/faults.json"), "faults.json")),),
            env={"MODEL_NAME": "$target70b", "TENSOR_PARALLEL_SIZE": "2", "ENFORCE_EAGER": "true", **NGRAM4},
            num_gpus=2,
            gpu_only="two GPUs",
        ),
    ]
}


# ------------------------------------------------------------------------------ commands
@dataclass(frozen=True, slots=True)
class Checkpoints:
    """What the checkpoint placeholders stand for, and the settings that serve them."""

    paths: Mapping[str, str]
    env: Env

    @classmethod
    def shapes(cls, root: Path) -> Checkpoints:
        return cls({name: str(root / folder) for name, (folder, _, _) in SHAPES.items()}, SHAPES_ENV)

    @classmethod
    def tiny(cls) -> Checkpoints:
        return cls(TINY, {})


def placeholders(text: str) -> set[str]:
    """The ``$name`` placeholders in ``text``."""
    return {m.group("named") or m.group("braced") for m in Template.pattern.finditer(text)} - {None}


def _layers(stage: Stage, run: Run, base: Env = SHAPES_ENV) -> dict[str, str | None]:
    return {**base, **COMMON_ENV, **stage.env, **run.env}


@dataclass(frozen=True, slots=True)
class Command:
    """A run made concrete: its arguments, its environment, and the settings the stage gave it."""

    argv: list[str]
    env: dict[str, str]
    settings: dict[str, str | None]


def command(
    stage: Stage,
    run: Run,
    *,
    checkpoints: Checkpoints,
    smoke: bool,
    environ: Mapping[str, str],
    values: Mapping[str, str],
    overrides: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    gpu: str | None = None,
) -> Command:
    """``run``'s command line and environment (the layers of the module docstring); ``values``:
    ``$scratch`` and ``$out``."""
    values = {**checkpoints.paths, **values}
    env = dict(environ)
    settings: dict[str, str | None] = {}
    for key, value in _layers(stage, run, checkpoints.env).items():
        settings[key] = None if value is None else Template(value).substitute(values)
    if run.speculation:
        speculation = Template(run.speculation).substitute(values)
        spec_env = config_env({}, real_sampler(speculation) if smoke else speculation)
        # Every other speculation setting, the environment's too, gives way to the configuration's.
        settings |= {key: None for key in [*environ, *settings] if "SPECULATI" in key} | dict(spec_env)
    settings |= overrides or {}
    for key, setting in settings.items():
        if setting is None:
            env.pop(key, None)
        else:
            env[key] = setting
    # Scripts import the worker from this checkout, as `-m worker` does from its folder.
    paths = [path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path]
    env["PYTHONPATH"] = os.pathsep.join(paths if str(ROOT) in paths else [*paths, str(ROOT)])
    argv = [Template(arg).substitute(values) for arg in run.program.argv(label=run.label, smoke=smoke, gpu=gpu)]
    argv += [Template(arg).safe_substitute(values) for arg in extra]
    return Command([sys.executable, *argv], env, settings)
