"""The worker's vLLM plugin: registered where vLLM looks, it gets the AMX tiles a process needs, and
under the FULL graphs the worker chose it keeps vLLM's fallback and adds vLLM's decode graphs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch

from tests.helpers import CACHE_DIR
from worker.tiny_models import TinyModels
from worker.vllm_internals.plugin import register

# Asks Linux what a fresh process may use (arch_prctl(ARCH_GET_XCOMP_PERM)): bit 18 is the AMX tile
# data, which a process without it cannot touch ("Illegal instruction").
_PERMITS_AMX = """
import ctypes, sys
{before}
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_uint64()
assert libc.syscall(158, 0x1022, ctypes.byref(mask)) == 0, ctypes.get_errno()
print(bool(mask.value >> 18 & 1))
"""


def _permits_amx(before: str) -> bool:
    code = _PERMITS_AMX.format(before=before)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip() == "True"


def test_vllm_loads_the_worker_plugin() -> None:
    from vllm.plugins import load_plugins_by_group

    assert load_plugins_by_group("vllm.general_plugins").get("runpod_worker") is register


@pytest.mark.skipif(
    sys.platform != "linux" or not torch.cpu._is_amx_tile_supported(), reason="the CPU has no AMX tiles"
)
def test_the_plugin_gets_the_amx_tiles_a_fresh_process_lacks() -> None:
    assert _permits_amx("") is False  # what vLLM's AMX kernels would die of
    assert _permits_amx("from worker.vllm_internals.plugin import register; register()") is True


@pytest.fixture
def vllm_methods_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vLLM methods the plugin wraps, put back as they were after the test (it wraps them in
    this process, once)."""
    from vllm.config.compilation import CompilationConfig
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    monkeypatch.setattr(
        CompilationConfig, "resolve_cudagraph_mode_and_sizes", CompilationConfig.resolve_cudagraph_mode_and_sizes
    )
    monkeypatch.setattr(ModelCudaGraphManager, "_init_candidates", ModelCudaGraphManager._init_candidates)


def _resolved_over(support_name: str, mode_name: str) -> str:
    """The CUDA-graph mode vLLM resolves for ``mode_name`` over an attention backend of this support."""
    from vllm.config.compilation import CompilationConfig, CompilationMode, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    config = CompilationConfig(
        cudagraph_mode=CUDAGraphMode[mode_name],
        mode=CompilationMode.VLLM_COMPILE,
        cudagraph_capture_sizes=[1, 2, 4, 8],
        max_cudagraph_capture_size=8,
    )
    config.set_splitting_ops_for_v1("allgather_reducescatter")
    support = AttentionCGSupport[support_name]
    return config.resolve_cudagraph_mode_and_sizes(support, "B", 1, use_v2_model_runner=True, max_num_reqs=8).name


def test_full_graphs_chosen_by_default_keep_vllms_fallback_for_a_backend_without_any(
    monkeypatch: pytest.MonkeyPatch, vllm_methods_restored: None
) -> None:
    from vllm.config.compilation import CompilationConfig

    from worker.vllm_internals.plugin import FULL_GRAPHS_ENV

    original = CompilationConfig.resolve_cudagraph_mode_and_sizes
    # vLLM alone: its default mode falls back to piecewise graphs over a backend without full
    # graphs (Llama 4's chunked local attention), FULL raises; decode-only support falls back by itself.
    assert _resolved_over("NEVER", "FULL_AND_PIECEWISE") == "PIECEWISE"
    with pytest.raises(ValueError, match="FULL is not supported"):
        _resolved_over("NEVER", "FULL")
    assert _resolved_over("UNIFORM_BATCH", "FULL") == "FULL_AND_PIECEWISE"
    monkeypatch.delenv(FULL_GRAPHS_ENV, raising=False)
    register()  # not asked for: nothing changes
    assert CompilationConfig.resolve_cudagraph_mode_and_sizes is original
    monkeypatch.setenv(FULL_GRAPHS_ENV, "1")
    register()
    register()  # once a process
    assert CompilationConfig.resolve_cudagraph_mode_and_sizes.__wrapped__ is original  # type: ignore[attr-defined]
    assert _resolved_over("NEVER", "FULL") == "PIECEWISE"
    assert _resolved_over("ALWAYS", "FULL") == "FULL"
    assert _resolved_over("UNIFORM_BATCH", "FULL") == "FULL_AND_PIECEWISE"
    monkeypatch.delenv(FULL_GRAPHS_ENV)  # a later engine of this process, without the marker: vLLM's own
    with pytest.raises(ValueError, match="FULL is not supported"):
        _resolved_over("NEVER", "FULL")


def _graph_manager(mode_name: str, schedule: list[list[int]] | None = None) -> Any:
    """vLLM's V2 graph manager over a config stand-in (capture sizes 1-32, 8 sequences; with
    ``schedule``, vLLM's batch-size schedule of k up to 4): its descriptors and dispatch need no
    GPU; nothing is captured."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    manager: Any = object.__new__(ModelCudaGraphManager)  # __init__ would ask for a GPU's graph pool
    cache = SimpleNamespace(use_kda_recoverssm=False)
    spec = None
    if schedule is not None:
        spec = SimpleNamespace(
            uses_dynamic_speculative_decoding=lambda: True, num_speculative_tokens_per_batch_size=schedule
        )
    k = 4 if schedule is not None else 0
    manager.vllm_config = SimpleNamespace(speculative_config=spec, cache_config=cache, num_speculative_tokens=k)
    sizes = [1, 2, 4, 8, 16, 32]
    manager.compilation_config = SimpleNamespace(cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=32)
    manager.max_num_reqs, manager.decode_query_len, manager.varlen_decode = 8, 1 + k, False
    manager.lora_capture_cases, manager._lora_dispatch_map, manager._max_lora_case = [0], {}, 0
    manager.ubatch_runner, manager._candidates, manager._capture_descs = None, {}, {}
    manager.cudagraph_mode = CUDAGraphMode[mode_name]
    manager._init_candidates()
    manager._graphs_captured = True  # dispatch answers only after a capture
    return manager


def test_full_graphs_chosen_by_default_get_vllms_decode_graphs_too(
    monkeypatch: pytest.MonkeyPatch, vllm_methods_restored: None
) -> None:
    from worker.vllm_internals.plugin import FULL_GRAPHS_ENV

    def decode_and_prompt(mode_name: str) -> tuple[Any, Any, list[Any]]:
        manager = _graph_manager(mode_name)
        decode = manager.dispatch(4, 4, 1, 0)  # 4 sequences, a token each
        prompt = manager.dispatch(2, 20, None, 0, max_query_len=17)  # one carries a prompt
        return decode, prompt, [d for descs in manager._capture_descs.values() for d in descs]

    # vLLM alone: FULL replays its prompt-carrying graphs for decode (no query length of their own).
    monkeypatch.delenv(FULL_GRAPHS_ENV, raising=False)
    vllms_full = decode_and_prompt("FULL")
    decode, prompt, full_descs = vllms_full
    assert (decode.cg_mode.name, decode.uniform_token_count) == ("FULL", None)
    assert (prompt.cg_mode.name, prompt.num_tokens) == ("FULL", 32)
    assert {d.uniform_token_count for d in full_descs} == {None}
    default_decode, default_prompt, default_descs = decode_and_prompt("FULL_AND_PIECEWISE")
    assert (default_decode.cg_mode.name, default_decode.uniform_token_count) == ("FULL", 1)
    assert default_prompt.cg_mode.name == "PIECEWISE"

    monkeypatch.setenv(FULL_GRAPHS_ENV, "1")
    register()
    decode, prompt, descs = decode_and_prompt("FULL")
    assert decode == default_decode  # the default mode's decode graph
    assert (prompt.cg_mode.name, prompt.num_tokens, prompt.uniform_token_count) == ("FULL", 32, None)
    assert set(descs) == set(full_descs) | {d for d in default_descs if d.cg_mode.name == "FULL"}
    assert len(descs) == len(set(descs))  # each captured once
    # In one order on every tensor-parallel rank: largest first, a size's decode graph before FULL's.
    assert descs == sorted(descs, key=lambda d: (-d.num_tokens, d.uniform_token_count is None))
    assert decode_and_prompt("FULL_AND_PIECEWISE") == (default_decode, default_prompt, default_descs)
    monkeypatch.delenv(FULL_GRAPHS_ENV)  # a later engine of this process, without the marker: vLLM's FULL
    assert decode_and_prompt("FULL") == vllms_full


def test_the_decode_graphs_under_full_serve_each_k_of_the_controllers_schedule(
    monkeypatch: pytest.MonkeyPatch, vllm_methods_restored: None
) -> None:
    from worker.speculation.decide import auto_schedule
    from worker.vllm_internals.plugin import FULL_GRAPHS_ENV

    schedule = auto_schedule(4, on_v2=True)  # every k from 4 to 0: queries of 5 down to 1 token

    def dispatched(mode_name: str) -> dict[tuple[int, int], tuple[int, int | None]]:
        """(sequences, query length) -> (graph's tokens, its query length), every uniform batch."""
        manager = _graph_manager(mode_name, schedule)
        batches = [(reqs, query) for query in range(1, 6) for reqs in range(1, 9) if reqs * query <= 32]
        descs = {(reqs, query): manager.dispatch(reqs, reqs * query, query, 0) for reqs, query in batches}
        return {batch: (d.num_tokens, d.uniform_token_count) for batch, d in descs.items()}

    monkeypatch.delenv(FULL_GRAPHS_ENV, raising=False)
    register()
    vllms_full = dispatched("FULL")
    assert {query for _, query in vllms_full.values()} == {None}  # vLLM's FULL: prompt-carrying graphs only
    monkeypatch.setenv(FULL_GRAPHS_ENV, "1")
    register()
    ours = dispatched("FULL")
    default = dispatched("FULL_AND_PIECEWISE")
    sizes = [1, 2, 4, 8, 16, 32]
    for (reqs, query), (tokens, graph_query) in ours.items():
        # Its own query length's smallest graph that holds it (vLLM's sizes rounded up to the query
        # length, none past the largest size); else, past them, FULL's smallest that does.
        rounded = [-(-size // query) * query for size in sizes]
        own: list[tuple[int, int | None]] = [(r, query) for r in rounded if reqs * query <= r <= 32]
        own = own or [(size, None) for size in sizes if size >= reqs * query]
        assert (tokens, graph_query) == min(own, key=lambda g: g[0]), (reqs, query)
        if default[reqs, query][1] == query:  # where vLLM's default mode finds a decode graph, the same one
            assert default[reqs, query] == (tokens, graph_query)
    # vLLM's default mode misses some (3 sequences at k = 0 meet k = 2's 3-token graph): not under FULL here.
    assert any(default[batch][1] != batch[1] for batch in default)


def test_the_boot_applies_the_full_graph_choices_once_the_plans_environment_is_set(
    tiny_models: TinyModels, vllm_methods_restored: None
) -> None:
    """vLLM loads plugins once a process: an engine core forked after a boot plan set the marker
    must still find vLLM's classes wrapped (the parent wraps them while it builds the config)."""
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    from worker.boot import launch as boot
    from worker.boot.plan import build_plan
    from worker.config import load_settings
    from worker.vllm_internals.plugin import FULL_GRAPHS_ENV, is_wrapped

    # The environment the plans write is restored too.
    plan = build_plan(load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR)}), mode="serverless")
    marked = dataclasses.replace(plan, environment={**plan.environment, FULL_GRAPHS_ENV: "1"})
    with mock.patch.dict(os.environ):
        boot.build_config(plan)  # this plan does not choose FULL (the CPU build): nothing wrapped
        assert not is_wrapped(ModelCudaGraphManager._init_candidates)
        boot.build_config(marked)  # one that does (a GPU's n-gram under auto on V2)
        assert is_wrapped(ModelCudaGraphManager._init_candidates)
