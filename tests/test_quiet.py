"""What the local run leaves out (worker/quiet.py): each entry says why, and a listed line goes while
any other stays. The default job's whole stderr: tests/test_entrypoints.py."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import pytest

from worker.quiet import SILENCED, silence


@pytest.fixture
def silenced() -> Iterator[None]:
    """:func:`silence` in this process, undone afterwards (its filters and vLLM's logger level)."""
    names = {entry.source for entry in SILENCED if entry.kind == "log"} | {"vllm"}
    saved = {name: (list(logging.getLogger(name).filters), logging.getLogger(name).level) for name in names}
    with warnings.catch_warnings():
        silence(vllm_level="WARNING")
        yield
    for name, (filters, level) in saved.items():
        logging.getLogger(name).filters[:] = filters
        logging.getLogger(name).setLevel(level)


def test_every_silenced_line_says_why_and_is_listed_once() -> None:
    assert all(entry.why and entry.message for entry in SILENCED)
    keys = [(entry.source, entry.message) for entry in SILENCED]
    assert len(keys) == len(set(keys))


@pytest.mark.usefixtures("silenced")
def test_a_listed_record_goes_and_any_other_stays(caplog: pytest.LogCaptureFixture) -> None:
    entry = next(entry for entry in SILENCED if entry.source == "vllm.platforms.cpu")
    logger = logging.getLogger(entry.source)
    with caplog.at_level(logging.WARNING, logger=entry.source):
        logger.warning("%s. triton-cpu is expected on x86 CPUs.", entry.message)
        logger.warning("KV cache size too small for this model: raise KV_CACHE_MEMORY_BYTES")
    assert [record.getMessage() for record in caplog.records] == [
        "KV cache size too small for this model: raise KV_CACHE_MEMORY_BYTES"
    ]
    # vLLM's INFO lines, before vLLM configures its own logging: held to its level from the start.
    assert not logging.getLogger("vllm.triton_utils.importing").isEnabledFor(logging.INFO)


@pytest.mark.usefixtures("silenced")
def test_a_listed_python_warning_goes_and_any_other_stays() -> None:
    entry = next(entry for entry in SILENCED if entry.kind == "warning")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence(vllm_level="WARNING")  # its filters go first, as they do in the run
        warnings.warn(f"{entry.message}, please use `torch.distributed.ReduceOp` instead", FutureWarning, stacklevel=1)
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]
