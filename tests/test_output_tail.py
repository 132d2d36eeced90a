"""A failed boot names the exception vLLM's engine core failed with (worker/boot/output_tail.py), not
the first traceback in what the engine's processes wrote.

The outputs here are fakes, written as vLLM 0.34's engine core writes them on a GPU without the
CUTLASS DSL (the lines of a run on an H100, shortened): DeepGEMM's import fails first and vLLM logs
it as a warning, with its traceback, and goes on; the kernel warm-up's import of ``cutlass`` then
kills the core. A real engine cannot be made to fail that way on a CPU;
tests/test_entrypoints.py boots one that dies for another reason and reads its real output.
"""

from __future__ import annotations

import subprocess
import sys

from worker.boot.output_tail import OutputTail, fatal_exception

# A fake engine core's output (see the module docstring): vLLM's log, a warning's traceback, then
# the fatal one, and what Python's multiprocessing writes to standard error as the process dies.
CORE = "(EngineCore pid=3749) "
WARNING_TRACEBACK = [
    f"{CORE}WARNING 12-05 15:49:12 [import_utils.py:417] Failed to import DeepGEMM's extension",
    f"{CORE}WARNING 12-05 15:49:12 [import_utils.py:417] Traceback (most recent call last):",
    f'{CORE}WARNING 12-05 15:49:12 [import_utils.py:417]   File "vllm/third_party/deep_gemm/_C.py", line 14',
    f"{CORE}WARNING 12-05 15:49:12 [import_utils.py:417]     assert len(so_files) == 1, (",
    f"{CORE}WARNING 12-05 15:49:12 [import_utils.py:417] AssertionError: Expected one _C_extension*.so file, "
    "found 0: []",
    f"{CORE}INFO 12-05 15:49:12 [gpu_model_runner.py:6535] Rank 0: Torch profiler disabled for CUDA graph capture",
]
FATAL_TRACEBACK = [
    f"{CORE}ERROR 12-05 15:49:14 [core.py:1757] EngineCore failed to start.",
    f"{CORE}ERROR 12-05 15:49:14 [core.py:1757] Traceback (most recent call last):",
    f'{CORE}ERROR 12-05 15:49:14 [core.py:1757]   File "vllm/model_executor/warmup/kernel_warmup.py", line 368',
    f"{CORE}ERROR 12-05 15:49:14 [core.py:1757]     from vllm.model_executor.warmup.minimax_m3_msa_warmup import (",
    f"{CORE}ERROR 12-05 15:49:14 [core.py:1757] ModuleNotFoundError: No module named 'cutlass'",
    f"{CORE}WARNING 12-05 15:49:15 [core.py:1800] Shutting down: ValueError: a later warning",
]
DEATH = [
    f"{CORE}Process EngineCore:",
    f"{CORE}Traceback (most recent call last):",
    f"{CORE}ModuleNotFoundError: No module named 'cutlass'",
]
CUTLASS = "ModuleNotFoundError: No module named 'cutlass'"
DEEP_GEMM = "AssertionError: Expected one _C_extension*.so file, found 0: []"


def test_the_cores_fatal_exception_not_an_earlier_warnings_traceback() -> None:
    assert fatal_exception("\n".join(WARNING_TRACEBACK + FATAL_TRACEBACK + DEATH)) == CUTLASS


def test_a_workers_failure_is_named_through_the_cores_wrapper() -> None:
    worker = "(Worker pid=3801) ERROR 12-05 15:49:14 [multiproc_executor.py:1091] "
    output = [
        *WARNING_TRACEBACK,
        f"{worker}WorkerProc failed to start.",
        f"{worker}Traceback (most recent call last):",
        f"{worker}{CUTLASS}",
        f"{CORE}ERROR 12-05 15:49:15 [core.py:1757] EngineCore failed to start.",
        f"{CORE}ERROR 12-05 15:49:15 [core.py:1757] Exception: WorkerProc initialization failed due to an "
        "exception in a background process. See stack trace for root cause.",
    ]
    assert fatal_exception("\n".join(output)) == CUTLASS


def test_a_bare_assertion_is_the_cores_cause() -> None:
    # An engine core that dies on a bare ``assert`` writes the exception's name alone on its line.
    bare = [
        *WARNING_TRACEBACK,
        f"{CORE}ERROR 12-05 15:49:14 [core.py:1757] EngineCore failed to start.",
        f"{CORE}ERROR 12-05 15:49:14 [core.py:1757] Traceback (most recent call last):",
        f'{CORE}ERROR 12-05 15:49:14 [core.py:1757]   File "vllm/v1/worker/gpu/model_runner.py", line 99',
        f"{CORE}ERROR 12-05 15:49:14 [core.py:1757]     assert self.kv_caches",
        f"{CORE}ERROR 12-05 15:49:14 [core.py:1757] AssertionError",
    ]
    assert fatal_exception("\n".join(bare)) == "AssertionError"


def test_without_vllms_log_the_last_exception_is_the_one_the_process_died_of() -> None:
    assert fatal_exception("\n".join(WARNING_TRACEBACK + DEATH)) == CUTLASS
    wrapped = [*WARNING_TRACEBACK, "RuntimeError: Engine core initialization failed. See root cause above."]
    assert fatal_exception("\n".join(wrapped)) == DEEP_GEMM  # the only cause written
    assert fatal_exception("INFO all well\n") is None


def test_the_tail_reads_a_fake_core_process_output() -> None:
    """A fake engine core: a child process that inherits the boot's descriptors, writes the output
    above (vLLM's log to standard output, multiprocessing's last words to standard error) and dies."""
    script = (
        "import sys; "
        f"print({chr(10).join(WARNING_TRACEBACK + FATAL_TRACEBACK)!r}, flush=True); "
        f"print({chr(10).join(DEATH)!r}, file=sys.stderr, flush=True); "
        "sys.exit(1)"
    )
    tail = OutputTail.start()
    assert tail is not None
    try:
        assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 1
        cause = tail.root_cause(wait_s=5.0)
    finally:
        tail.restore()
    assert cause == CUTLASS
