"""What vLLM's engine processes write while the engine starts, kept to name a failed boot's cause.

vLLM's engine core (and on some platforms a worker process below it) runs in a process of its own;
when it dies while starting, the frontend raises "Engine core initialization failed. See root cause
above." and the cause exists only in what those processes wrote. No vLLM hook hands it over:
:class:`OutputTail` passes the boot's standard output and error through pipes and keeps their tail.
Imports nothing of vLLM's.
"""

from __future__ import annotations

import collections
import os
import re
import threading
import time

__all__ = ["OutputTail", "fatal_exception"]


# A traceback's last line: the exception's type (dotted names allowed) and its message.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt)(?:: ?\S|$)")
# What vLLM puts before a line a process of its own writes ("(EngineCore pid=123) "), and its log
# header ("ERROR 12-01 05:33:38 [core.py:1510] ").
_LINE_PREFIX = re.compile(r"^\([^)]*pid=\d+\)\s*(?:[A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]*\]\s?)?")
# vLLM's messages that only point elsewhere ("see root cause above").
_WRAPPERS = ("Engine core initialization failed", "WorkerProc initialization failed", "See root cause above")
# What vLLM logs, with the traceback, when an engine core or a worker below it fails for good
# (``logger.exception`` in ``vllm/v1/engine/core.py`` and ``vllm/v1/executor/multiproc_executor.py``).
_FATAL = (
    "EngineCore failed to start",
    "EngineCore encountered a fatal error",
    "WorkerProc failed to start",
    "WorkerProc hit an exception",
)


def fatal_exception(text: str) -> str | None:
    """The exception an engine's processes failed with, from what they wrote: the first exception
    line (``ModuleNotFoundError: No module named 'cutlass'``) of the traceback vLLM logs as a
    process's failure, not one of vLLM's "see above" wrappers; where vLLM logged none (its logging
    turned off), the last exception line written, the one the process died of. Never an earlier
    traceback that vLLM logged as a warning and went on (DeepGEMM's, on a build without its kernels);
    None where no exception line was written."""
    lines = [_LINE_PREFIX.sub("", line).strip() for line in text.splitlines()]
    fatal = next((i for i, line in enumerate(lines) if any(m in line for m in _FATAL)), None)
    causes = [
        line for line in lines[fatal or 0 :] if _EXCEPTION_LINE.match(line) and not any(w in line for w in _WRAPPERS)
    ]
    if not causes:
        return None
    return (causes[0] if fatal is not None else causes[-1])[:500]


class OutputTail:
    """Standard output and error passed through pipes while the engine starts, their last 64 KiB kept.

    vLLM's engine core (and on some platforms a worker process below it) runs in a process of its
    own; when it dies while starting, the frontend raises "Engine core initialization failed. See
    root cause above." and the cause exists only in what those processes wrote (vLLM logs to
    standard output, Python's tracebacks go to standard error). No vLLM hook hands it over, so the
    boot points descriptors 1 and 2 at pipes while the engine's processes are created (they
    inherit them for their lifetime), and a thread per pipe copies everything to the real
    descriptor, unchanged, keeping the tail to read the root cause from. This process's own
    descriptors are restored as soon as the engine is up; the threads go on copying the engine
    processes' (rare) later lines.
    """

    def __init__(self) -> None:
        self._tail: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._lock = threading.Lock()
        self._saved: dict[int, int] = {}

    @classmethod
    def start(cls) -> OutputTail | None:
        tail = cls()
        try:
            for fd in (1, 2):
                read_fd, write_fd = os.pipe()
                tail._saved[fd] = os.dup(fd)
                os.dup2(write_fd, fd)
                os.close(write_fd)
                threading.Thread(
                    target=tail._pump, args=(read_fd, tail._saved[fd]), name=f"engine-output-{fd}", daemon=True
                ).start()
        except OSError:  # no descriptor to redirect (or none left): boot without the tail
            tail.restore()
            return None
        return tail

    def _pump(self, read_fd: int, out_fd: int) -> None:
        """Copy the pipe to ``out_fd`` until its last writer (an engine process) is gone, then close
        both: this process's own descriptor was restored from ``out_fd`` long before that."""
        try:
            while data := os.read(read_fd, 65536):
                try:
                    os.write(out_fd, data)
                except OSError:
                    pass
                with self._lock:
                    self._tail.append(data)
                    self._size += len(data)
                    while self._size > 65536 and len(self._tail) > 1:
                        self._size -= len(self._tail.popleft())
        except OSError:
            pass
        finally:
            os.close(read_fd)
            os.close(out_fd)

    def restore(self) -> None:
        """Point this process's descriptors back where they were (the pipes stay for the engine's processes)."""
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)

    def root_cause(self, *, wait_s: float = 1.0) -> str | None:
        """The exception the engine's processes failed with (:func:`fatal_exception`), e.g.
        ``ValueError: Available memory on node 0 ...``; or None."""
        deadline = time.monotonic() + wait_s  # a dying process's last lines may still be in a pipe
        while True:
            with self._lock:
                text = b"".join(self._tail).decode(errors="replace")
            cause = fatal_exception(text)
            if cause is not None or time.monotonic() > deadline:
                return cause
            time.sleep(0.05)
