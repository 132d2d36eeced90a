"""A drafter setting that the chosen method ignores is refused when the settings are read
(``worker/config/speculation.py``), naming both: vLLM drops it without a word, and the deployer
would be served by another drafter than the one set."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.config import load_settings
from worker.errors import ConfigError

_TARGET = {"MODEL_NAME": "org/target"}


def _config(**keys: Any) -> dict[str, str]:
    return {**_TARGET, "SPECULATIVE_CONFIG": json.dumps({"num_speculative_tokens": 3, **keys})}


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        pytest.param(
            {**_TARGET, "SPECULATIVE_METHOD": "ngram", "SPECULATIVE_MODEL": "org/draft"},
            "SPECULATIVE_MODEL=org/draft has no effect under SPECULATIVE_METHOD=ngram",
            id="a draft model beside n-gram",
        ),
        pytest.param(
            {**_TARGET, "SPECULATIVE_METHOD": "suffix", "SPECULATIVE_MODEL": "org/draft"},
            "SPECULATIVE_MODEL=org/draft has no effect under SPECULATIVE_METHOD=suffix",
            id="a draft model beside suffix decoding",
        ),
        pytest.param(
            _config(method="ngram", model="org/draft"),
            'SPECULATIVE_CONFIG: "model" has no effect under method "ngram"',
            id="a config's model beside n-gram",
        ),
        pytest.param(
            _config(method="ngram_gpu", quantization="awq"),
            'SPECULATIVE_CONFIG: "quantization" has no effect under method "ngram_gpu"',
            id="a draft's quantization beside n-gram",
        ),
        pytest.param(
            _config(model="org/draft", prompt_lookup_max=4),
            'SPECULATIVE_CONFIG: "prompt_lookup_max" sets n-gram matching, which method "draft_model" does not run',
            id="n-gram's lookup beside a draft model",
        ),
        pytest.param(
            _config(method="eagle3", model="org/eagle3-head", prompt_lookup_min=1),
            'SPECULATIVE_CONFIG: "prompt_lookup_min" sets n-gram matching, which method "eagle3" does not run',
            id="n-gram's lookup beside EAGLE-3",
        ),
        pytest.param(
            _config(method="ngram", prompt_lookup_max=4, suffix_decoding_max_tree_depth=8),
            'SPECULATIVE_CONFIG: "suffix_decoding_max_tree_depth" sets suffix decoding, which method "ngram" does '
            "not run",
            id="suffix decoding's keys beside n-gram",
        ),
        pytest.param(
            {**_TARGET, "SPECULATIVE_METHOD": "none", "NUM_SPECULATIVE_TOKENS": "3"},
            "SPECULATIVE_METHOD=none turns speculation off: unset NUM_SPECULATIVE_TOKENS",
            id="k beside none",
        ),
    ],
)
def test_a_drafter_setting_the_method_ignores_is_refused_naming_both(env: dict[str, str], sentence: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert sentence in caught.value.message


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({**_TARGET, "SPECULATIVE_METHOD": "ngram"}, id="n-gram"),
        pytest.param({**_TARGET, "SPECULATIVE_MODEL": "org/draft"}, id="a draft model"),
        pytest.param({**_TARGET, "SPECULATIVE_METHOD": "eagle3", "SPECULATIVE_MODEL": "org/head"}, id="EAGLE-3"),
        pytest.param(_config(method="ngram", model="ngram", prompt_lookup_max=4), id="n-gram named as vLLM names it"),
        pytest.param(_config(model="[ngram]", prompt_lookup_max=4), id="n-gram inferred from the model"),
        pytest.param(_config(method="suffix", suffix_decoding_max_tree_depth=8), id="suffix decoding's keys"),
        pytest.param(_config(model="org/draft", revision="main", quantization="awq"), id="a draft's own keys"),
    ],
)
def test_every_setting_the_method_uses_passes(env: dict[str, str]) -> None:
    load_settings(env)
