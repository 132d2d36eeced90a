"""Times the boot's import of vLLM in this process, and the garbage collector's share of it: with the
collector on as Python leaves it (``plain``), or as the boot imports it, through
``worker.runtime.import_boot`` (``uncollected``: the collector off, one young-generation walk at
the end, the heap frozen). Run each in a fresh process, alternating:

    for i in 1 2 3 4 5; do for m in plain uncollected; do python scripts/import_collector.py $m; done; done

Prints one JSON line: the import's seconds, the collector's seconds and its collections.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from typing import Any

import worker.runtime as runtime


def main(mode: str) -> dict[str, Any]:
    spent = {"s": 0.0, "collections": 0, "started": 0.0}

    def timed(phase: str, _: dict[str, Any]) -> None:
        if phase == "start":
            spent["started"] = time.perf_counter()
        else:
            spent["s"] += time.perf_counter() - spent["started"]
            spent["collections"] += 1

    gc.callbacks.append(timed)
    started = time.perf_counter()
    if mode == "uncollected":
        runtime.import_boot()
    else:
        import worker.boot.launch  # noqa: F401  (vLLM with it)
    return {
        "mode": mode,
        "import_s": round(time.perf_counter() - started, 2),
        "collector_s": round(spent["s"], 2),
        "collections": spent["collections"],
    }


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("plain", "uncollected"):
        sys.exit("usage: python scripts/import_collector.py plain|uncollected")
    print(json.dumps(main(sys.argv[1])))
