"""The keys vLLM's configuration takes, asked of the installed vLLM: its engine arguments (the fields
of ``AsyncEngineArgs``: ``ENGINE_ARGS``' keys) and its speculative config's (the fields of
``SpeculativeConfig``: ``SPECULATIVE_CONFIG``'s keys), which differ from release to release.

vLLM's own answer rather than a list written out here: each release adds and drops keys. Importing
either class loads vLLM, seconds on a CPU, so the start asks only where one of those settings is set
(:mod:`worker.boot.preflight`), and the boot then finds vLLM imported.
"""

from __future__ import annotations

import dataclasses
import logging

__all__ = ["engine_arg_names", "speculative_config_keys"]


def _quiet_import() -> None:
    """At start a refusal is the one line printed: vLLM's CPU build logs at INFO, as it loads, that
    it runs without Triton, which says nothing about the setting."""
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.WARNING)


def engine_arg_names() -> frozenset[str]:
    """The keys ``ENGINE_ARGS`` may hold: vLLM's engine arguments."""
    _quiet_import()
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(field.name for field in dataclasses.fields(AsyncEngineArgs))


def speculative_config_keys() -> frozenset[str]:
    """The keys ``SPECULATIVE_CONFIG`` may hold: the fields of vLLM's speculative config, which
    refuses any other when the engine's config is built."""
    _quiet_import()
    from vllm.config.speculative import SpeculativeConfig

    return frozenset(field.name for field in dataclasses.fields(SpeculativeConfig))
