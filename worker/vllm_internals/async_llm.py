"""What the worker reaches for inside vLLM's ``AsyncLLM`` beyond its public methods: the engine
core's death flag, the output processor's request states, the renderer, the client settings of an
engine core another process started."""

from __future__ import annotations

import re
from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

from vllm import TokensPrompt
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from worker.errors import one_line

__all__ = [
    "add_lora_failure",
    "client_kwargs",
    "is_cpu_platform",
    "mark_engine_dead",
    "render_token_prompt",
    "request_failure",
    "request_state",
    "set_api_process",
]


def mark_engine_dead(llm: AsyncLLM) -> None:
    """Report the engine dead from now on and fail every request in flight, as vLLM does when its
    own monitor sees the engine core die (it has no public call for a death another process saw)."""
    llm.engine_core.resources.engine_dead = True
    llm.output_processor.propagate_error(EngineDeadError())


# vLLM 0.32's collective RPC wraps a model worker's error as "Call to add_lora method failed: Worker
# failed with error '<the reason>', please check the stack trace above for the root cause".
_WORKER_ERROR = re.compile(r"failed with error '(.*)', please check")


def add_lora_failure(exc: BaseException) -> str | None:
    """Why ``AsyncLLM.add_lora`` failed, in the model worker's own words; None when the failure is
    not the adapter's (the engine died: that is the engine's error, not the setting's). The wording
    is vLLM's message, not an API: a message in another shape is returned whole."""
    if isinstance(exc, EngineDeadError):
        return None
    message = one_line(exc)
    inner = _WORKER_ERROR.search(message)
    return inner.group(1) if inner else message


def request_failure(exc: Exception) -> Exception:
    """What failed a request inside ``AsyncLLM.generate``: ``exc`` itself, or where ``generate``
    wrapped it, the exception it wrapped. ``generate`` wraps whatever it did not expect in an
    ``EngineGenerateError`` with no message, the failure as its ``__cause__`` (a ``ValueError`` from
    a request's checks too), and logs it only when requests are logged. Answered as it comes, such a
    failure reached a client as a 500 with an empty message and left no line in the log (a named
    tool call on vLLM 0.34, on an H100)."""
    cause = exc.__cause__ if isinstance(exc, EngineGenerateError) else None
    return cause if isinstance(cause, Exception) else exc


def request_state(llm: AsyncLLM, request_id: str) -> Any:
    """vLLM's frontend state of a request (None: not tracked), through its external -> internal id map."""
    processor = llm.output_processor
    ids = processor.external_req_ids.get(request_id)
    return processor.request_states.get(ids[0]) if ids else None


def render_token_prompt(llm: AsyncLLM, prompt_ids: Sequence[int]) -> Any:
    """vLLM's engine input for these token ids, by its renderer as its frontend calls it (raw
    prompts handed to ``generate()`` are deprecated in 0.32): its own checks, e.g. the context length."""
    (engine_input,) = llm.renderer.render_cmpl([TokensPrompt(prompt_token_ids=list(prompt_ids))])
    return engine_input


def is_cpu_platform() -> bool:
    return bool(current_platform.is_cpu())


def set_api_process(args: AsyncEngineArgs | Namespace, *, count: int, rank: int) -> None:
    """What vLLM's multi-API-server launcher sets on the engine arguments (rank -1: the process that
    starts the engine core); private fields of ``AsyncEngineArgs``."""
    args._api_process_count, args._api_process_rank = count, rank


def client_kwargs(
    addresses: Mapping[str, Any],
    *,
    count: int,
    index: int,
    usage_context: UsageContext = UsageContext.OPENAI_API_SERVER,
) -> dict[str, Any]:
    """``AsyncLLM.from_vllm_config``'s arguments for a client of an engine core started apart from it
    (what vLLM's API server processes pass; the serverless engine's own client, ``core_first``, names
    its engine context)."""
    return {
        "usage_context": usage_context,
        "client_addresses": dict(addresses),
        "client_count": count,
        "client_index": index,
    }
