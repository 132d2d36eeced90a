"""The stop-string trigger rule against vLLM's own detokenizer: whenever vLLM's frontend finds a stop
string in a step's text, the worker's scheduler hook attached a snapshot to that step's output.

Random token streams (uniform over the vocabulary: byte pieces, special tokens and all; and
encoded text with multi-byte characters), split into random steps, on two tokenizer styles:
byte-level BPE (the tiny models', as GPT-2 / Llama 3 / Qwen) and SentencePiece-style (``▁`` for
spaces, byte fallback, a stripped leading space, as Llama 2 / Mistral). Stop strings are cut from
the stream's own text, so most trials end on one. The hook runs over a stand-in for vLLM's
scheduler (the engine tests in ``test_engine_spec.py`` run it inside the real engine core).
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker.stop_triggers import EVERY, StopTriggers, TriggerSet, completing

TEXTS = [
    "Thought: I should look it up.\nAction: search[vLLM]\nObservation: a fast engine.\n\n",
    "Les élèves déjà prêts — naïve café, 日本語のテキスト, emoji 🙂 and ümlauts.\n",
    '{"name": "tool", "arguments": {"x": 1}}</tool_call>\n<|end|>\n',
    "  indented   spaces\tand\ttabs, then ... ellipses!? and ' quotes \" here.\n\n\n",
]


def _sentencepiece_tokenizer(directory: Path) -> Any:
    """A Llama-2-style tokenizer built offline: BPE over ``▁``-joined words, byte fallback
    (``<0x..>`` pieces), and the decoder that replaces ``▁``, fuses bytes and strips one space."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.train_from_iterator(TEXTS * 20, trainer=trainer)
    vocab = base.get_vocab()
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges: list[tuple[str, str]] = [
        (m.split(" ")[0], m.split(" ")[1]) if isinstance(m, str) else (m[0], m[1]) for m in _merges(base)
    ]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = base.normalizer
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")  # type: ignore[no-untyped-call]
    fast.save_pretrained(directory)
    return directory


def _merges(tokenizer: Any) -> list[Any]:
    import json

    return list(json.loads(tokenizer.to_str())["model"]["merges"])


def _load(path: Path) -> Any:
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(path))


@pytest.fixture(scope="module")
def tokenizers(tiny_models: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        "byte-level": _load(tiny_models.target),
        "sentencepiece": _load(_sentencepiece_tokenizer(tmp_path_factory.mktemp("sp"))),
    }


def _hooked_scheduler(triggers: StopTriggers) -> Any:
    """The worker's hook over a stand-in for vLLM's scheduler that returns this step's outputs."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

    from worker.spec_scheduler import SpecMetricsSnapshots

    class Core:
        def __init__(self) -> None:
            self.requests: dict[str, Any] = {}
            self.step_tokens: dict[str, list[int]] = {}

        def add_request(self, request: Any) -> None:
            self.requests[request.request_id] = request

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            for rid, tokens in self.step_tokens.items():  # as vLLM's does before the hook runs
                self.requests[rid].append_output_token_ids(tokens)
            outs = [EngineCoreOutput(rid, list(tokens)) for rid, tokens in self.step_tokens.items()]
            return {0: EngineCoreOutputs(outputs=outs)}

    class Hooked(SpecMetricsSnapshots, Core):
        pass

    scheduler = Hooked()
    scheduler._triggers = triggers
    scheduler._triggers_started = True
    return scheduler


def _request(rid: str, prompt: list[int], params: Any, metrics: Any) -> Any:
    """vLLM's own engine-core request, with the metrics vLLM's scheduler gives it."""
    from vllm.v1.request import Request

    request = Request(rid, prompt, params, None)
    request.spec_decode_metrics = metrics
    return request


def _trial(rng: random.Random, tokenizer: Any, triggers: StopTriggers) -> tuple[int, int]:
    """One request: returns (steps on which vLLM found a stop string, of those with a snapshot)."""
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    size = len(tokenizer)
    if rng.random() < 0.5:
        stream = [rng.randrange(size) for _ in range(rng.randint(5, 60))]
    else:
        text = "".join(rng.choice(TEXTS) for _ in range(2))
        stream = tokenizer.encode(text, add_special_tokens=False)
    text = tokenizer.decode(stream, skip_special_tokens=rng.random() < 0.5)
    if not text.strip():
        return 0, 0
    end = rng.randint(1, len(text))
    stop = text[max(0, end - rng.randint(1, 6)) : end]
    if stop.endswith(" "):  # every step snapshots: nothing to check (tested apart)
        return 0, 0
    params = SamplingParams(
        stop=[stop],
        max_tokens=1000,
        min_tokens=rng.choice([0, 0, 3]),
        skip_special_tokens=rng.random() < 0.7,
        spaces_between_special_tokens=rng.random() < 0.5,
        include_stop_str_in_output=rng.random() < 0.3,
    )
    prompt = [rng.randrange(size) for _ in range(rng.randint(1, 4))]
    request: Any = SimpleNamespace(request_id="r", sampling_params=params, prompt_token_ids=prompt)
    detokenizer = FastIncrementalDetokenizer(tokenizer, request)
    scheduler = _hooked_scheduler(triggers)
    scheduler.add_request(_request("r", prompt, params, RequestSpecDecodeMetrics.new(4)))
    found = snapshotted = 0
    position = 0
    while position < len(stream):
        step = stream[position : position + rng.randint(1, 5)]
        position += len(step)
        scheduler.step_tokens = {"r": step}
        (output,) = scheduler.update_from_output(None, None)[0].outputs
        if detokenizer.update(step, False) is not None:
            found += 1
            snapshotted += output.spec_decode_metrics is not None
            break
    return found, snapshotted


@pytest.mark.parametrize("style", ["byte-level", "sentencepiece"])
def test_every_step_that_completes_a_stop_string_has_a_snapshot(tokenizers: dict[str, Any], style: str) -> None:
    from worker.spec_scheduler import stop_triggers

    tokenizer = tokenizers[style]
    triggers = stop_triggers(tokenizer, vocab_size=len(tokenizer) + 3)
    assert triggers is not None
    assert len(triggers.partial) >= 128, "byte pieces decode alone to U+FFFD, or are <0x..> pieces"
    assert triggers.silent, "special tokens add no text when skipped"
    rng = random.Random(1234)
    found = snapshotted = 0
    for _ in range(3000):
        f, s = _trial(rng, tokenizer, triggers)
        found += f
        snapshotted += s
    assert found > 1600, "most trials must end on their stop string, or the check says little"
    assert snapshotted == found


def _trigger_set(triggers: StopTriggers, stops: list[str]) -> TriggerSet:
    found = triggers.for_stops(stops)
    assert isinstance(found, TriggerSet)
    return found


def _completes(
    triggers: StopTriggers, trigger: TriggerSet, new: list[int], history: list[int], prompt: list[int] | None
) -> bool:
    """Whether one step's ``new`` tokens (which hit ``trigger``) can complete a stop string, by
    :func:`completing` over stand-ins for vLLM's output and request: ``history`` is the output so
    far, ending with ``new``; ``prompt`` precedes it."""
    step = SimpleNamespace(request_id="r", new_token_ids=new, spec_decode_metrics=None)
    request = SimpleNamespace(_output_token_ids=history, prompt_token_ids=prompt)
    return bool(completing([step], {"r": trigger}, {"r": request}))


def test_trigger_sets() -> None:
    pieces = ["a", "b", "ab", "ba", ":", "n:", "tion:", "\n", "\n\n", ".\n", "x\ufffd", "\ufffd", " ", "Obs", "c"]
    triggers = StopTriggers(pieces, vocab_size=len(pieces) + 2)
    ids = {piece: i for i, piece in enumerate(pieces)}
    partial = {ids["x\ufffd"], ids["\ufffd"], len(pieces), len(pieces) + 1}
    assert triggers.partial == partial
    # "\n\n" can end in a piece holding it, or in one that starts with "\n" after a "\n".
    blank = _trigger_set(triggers, ["\n\n"])
    assert blank.ids == {ids["\n"], ids["\n\n"]} | partial
    assert blank.needs == {ids["\n"]: {"\n"}}
    assert blank.check == {ids["\n"]: {"\n"}, ids["\n\n"]: None} | dict.fromkeys(partial)
    # The ids that may come before "\n": those ending with "\n", and those whose last character is not known.
    assert blank.after[ids["\n"]] == frozenset({ids["\n"], ids["\n\n"], ids[".\n"]} | partial)
    # ``history``: the output so far, ending with the step's tokens; the prompt before it.
    assert not _completes(triggers, blank, [ids["\n"]], [ids["a"], ids["\n"]], None)
    assert not _completes(triggers, blank, [ids["\n"]], [ids["\n"]], [ids["a"]])
    assert _completes(triggers, blank, [ids["\n"]], [ids[".\n"], ids["\n"]], None)
    assert _completes(triggers, blank, [ids["\n"]], [ids["\n"]], [ids[".\n"]])
    assert _completes(triggers, blank, [ids["a"], ids["\n\n"]], [ids["a"], ids["\n\n"]], None)
    assert _completes(triggers, blank, [ids["\n"]], [ids["\n"]], None), "nothing before: assume it can"
    assert _completes(triggers, blank, [ids["\n"]], [ids["x\ufffd"], ids["\n"]], None), "a partial piece: it can"
    assert _completes(triggers, blank, [ids["\n"]], [ids[".\n"], ids["a"]], None), "history not ending with the step"
    assert _completes(triggers, blank, [ids["\n"]], [len(pieces) + 5, ids["\n"]], None), "an id past the table: it can"
    assert not _completes(triggers, blank, [ids["a"], ids["\n"]], [ids[".\n"], ids["a"], ids["\n"]], None)
    agent = _trigger_set(triggers, ["Observation:"])
    assert agent.ids == {ids[":"], ids["n:"], ids["tion:"]} | partial
    assert agent.needs == {ids[":"]: {"n"}, ids["n:"]: {"o"}, ids["tion:"]: {"a"}}
    assert not _completes(triggers, agent, [ids["Obs"], ids[":"]], [ids["Obs"], ids[":"]], None)
    assert _completes(triggers, agent, [ids["a"], ids["tion:"]], [ids["a"], ids["tion:"]], None)
    pair = _trigger_set(triggers, ["ab", "zz"])
    assert pair.ids == {ids["ab"], ids["b"], ids["ba"]} | partial
    assert _completes(triggers, pair, [ids["a"], ids["b"]], [ids["a"], ids["b"]], None)
    assert not _completes(triggers, pair, [ids["b"], ids["b"]], [ids["c"], ids["b"], ids["b"]], None)
    # A space before the stop's end may belong to the token's own text once decoded in context.
    spaced = _trigger_set(triggers, ["a b"])
    assert ids["b"] in spaced.always and ids["b"] not in spaced.needs
    assert triggers.for_stops(["ok", "end "]) is EVERY
    assert triggers.for_stops([""]) is EVERY
    assert triggers.for_stops(["\n\n"]) is blank, "cached"


def test_the_hook_snapshots_only_on_trigger_steps_and_all_requests_periodically() -> None:
    from vllm import SamplingParams
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    from worker.spec_scheduler import SNAPSHOT_EVERY_STEPS

    pieces = ["a", "b", "\ufffd", "c"]
    scheduler = _hooked_scheduler(StopTriggers(pieces))
    for rid, stop in (("stop", ["ab"]), ("space", ["b "]), ("plain", None)):
        scheduler.add_request(_request(rid, [0], SamplingParams(stop=stop), RequestSpecDecodeMetrics.new(3)))
    # Step tokens for the request with a stop string: b after a can complete "ab"; the byte piece
    # holds the request on every step until a step ends on a whole character; b after b or c cannot.
    script = {1: [0], 2: [1], 3: [0, 0], 4: [2], 5: [0], 6: [0], 7: [3, 2], 8: [2], 9: [0, 3], 11: [3, 1], 12: [1]}
    steps: dict[str, list[int]] = {"stop": [], "space": [], "plain": []}
    for step in range(1, SNAPSHOT_EVERY_STEPS + 1):
        tokens = script.get(step, [0])
        scheduler.step_tokens = {rid: tokens if rid == "stop" else [0] for rid in scheduler.requests}
        for request in scheduler.requests.values():
            request.spec_decode_metrics.observe(num_draft_tokens=3, num_accepted=step % 4)
        if step == SNAPSHOT_EVERY_STEPS - 1:
            del scheduler.requests["space"]  # finished: pruned at the next periodic step
            del scheduler.step_tokens["space"]
        for output in scheduler.update_from_output(None, None)[0].outputs:
            request = scheduler.requests.get(output.request_id)
            if output.spec_decode_metrics is not None:
                steps[output.request_id].append(step)
                live = request.spec_decode_metrics
                assert output.spec_decode_metrics == live and output.spec_decode_metrics is not live
    assert steps["stop"] == [2, 4, 5, 7, 8, 9, SNAPSHOT_EVERY_STEPS]
    assert steps["space"] == list(range(1, SNAPSHOT_EVERY_STEPS - 1))
    assert steps["plain"] == [SNAPSHOT_EVERY_STEPS]
    assert set(scheduler._watch) == set(scheduler._trigger_of) == {"stop"} and not scheduler._held


def test_a_shared_trigger_set_snapshots_only_its_watched_requests() -> None:
    """When every watched request has one trigger set, the hook tests every output against it:
    a request without stop strings whose tokens hit it gets only its periodic snapshot."""
    from vllm import SamplingParams
    from vllm.v1.metrics.stats import RequestSpecDecodeMetrics

    scheduler = _hooked_scheduler(StopTriggers(["a", "b", "c"]))
    for rid, stop in (("stop", ["ab"]), ("other", ["ab"]), ("plain", None)):
        scheduler.add_request(_request(rid, [2], SamplingParams(stop=stop), RequestSpecDecodeMetrics.new(3)))
    assert scheduler._shared is not None
    script = {1: [0], 2: [1], 3: [1], 4: [0, 1], 5: [2, 1], 6: [0], 7: [1, 1]}
    steps: dict[str, list[int]] = {"stop": [], "other": [], "plain": []}
    for step, tokens in script.items():
        scheduler.step_tokens = {"stop": tokens, "other": [2], "plain": tokens}
        for output in scheduler.update_from_output(None, None)[0].outputs:
            if output.spec_decode_metrics is not None:
                steps[output.request_id].append(step)
    assert steps == {"stop": [2, 4, 7], "other": [], "plain": []}
