"""What vLLM's ``AsyncLLM`` does in the main process before it starts the engine core's process: on
the serverless path that work lies between the engine config and the core's first line (the boot's
"engine core process start" phase: docs/gpu-results/HISTORY.md, "The levers, and what each did"), in
series with the whole of the core's boot.

    python scripts/frontend_before_core.py MODEL_DIR [--profile N]

Builds the engine config of MODEL_DIR (eager, small), then times ``AsyncLLM.from_vllm_config`` until
the first process start and prints it; with ``--profile N``, under cProfile (which inflates Python-
heavy work such as deep copies: take the time from a run without it), with the profile's top N by
cumulative time. The core is forked (``VLLM_WORKER_MULTIPROC_METHOD=fork``, as the serverless
worker's core is).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from multiprocessing import process
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--profile", type=int, metavar="N", help="profile, and print the top N calls")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    config = AsyncEngineArgs(
        model=args.model, max_model_len=1024, max_num_seqs=8, enforce_eager=True
    ).create_engine_config()
    profile = cProfile.Profile()
    first_start: list[float] = []
    original_start = process.BaseProcess.start

    def start(self: Any) -> None:  # the profile ends where the core's process begins
        if not first_start:
            first_start.append(time.perf_counter())
            profile.disable()
        original_start(self)

    process.BaseProcess.start = start  # type: ignore[method-assign]
    try:
        began = time.perf_counter()
        if args.profile:
            profile.enable()
        llm = AsyncLLM.from_vllm_config(config)
        profile.disable()
    finally:
        process.BaseProcess.start = original_start  # type: ignore[method-assign]
    if not first_start:
        raise SystemExit("no process started: the engine core ran in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0?)")
    label = " (profiled)" if args.profile else ""
    print(f"before the engine core's process starts{label}: {first_start[0] - began:.3f} s")
    if args.profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.profile)
        print(out.getvalue())
    llm.shutdown()


if __name__ == "__main__":
    main()
