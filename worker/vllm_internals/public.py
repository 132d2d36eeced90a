"""The short list of vLLM's public surface that the worker's modules outside the seam may import:
module -> names. Everything else of vLLM's is reached through ``worker/vllm_internals/``
(``tests/test_vllm_seam.py`` fails, naming the file and line, on any other vLLM import outside it).

What is here: the engine and its arguments and config (``AsyncLLM``, ``AsyncEngineArgs``,
``VllmConfig``, ``UsageContext``), a request's parameters (``SamplingParams`` and its enums,
``StructuredOutputsParams``, ``LoRARequest``), vLLM's typed errors, and the entrypoints that build
vLLM's OpenAI app over an engine client (``build_app``, ``init_app_state``, ``EngineClient``; its
server parser, ``make_arg_parser``, moved between releases: the seam's
:func:`~worker.vllm_internals.variants.server_arg_parser`). For the bench: vLLM's offline engine
(``LLM``) and a prompt of token ids (``TokensPrompt``). Imports nothing.
"""

from __future__ import annotations

__all__ = ["PUBLIC_SURFACE"]

PUBLIC_SURFACE: dict[str, frozenset[str]] = {
    "vllm": frozenset({"LLM", "SamplingParams", "TokensPrompt"}),
    "vllm.config": frozenset({"VllmConfig"}),
    "vllm.engine.arg_utils": frozenset({"AsyncEngineArgs"}),
    "vllm.engine.protocol": frozenset({"EngineClient"}),
    "vllm.entrypoints.launchers.api_server.app_state": frozenset({"init_app_state"}),
    "vllm.entrypoints.launchers.app": frozenset({"build_app"}),
    "vllm.exceptions": frozenset({"VLLMClientError", "VLLMValidationError"}),
    "vllm.lora.request": frozenset({"LoRARequest"}),
    "vllm.sampling_params": frozenset({"RequestOutputKind", "SamplingType", "StructuredOutputsParams"}),
    "vllm.usage.usage_lib": frozenset({"UsageContext"}),
    "vllm.v1.engine.async_llm": frozenset({"AsyncLLM"}),
    "vllm.v1.engine.exceptions": frozenset({"EngineDeadError", "EngineGenerateError"}),
}
