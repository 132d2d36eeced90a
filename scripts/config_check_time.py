"""Times the boot's build of vLLM's config (``worker.boot.launch.build_config``, the serverless
default over the tiny target) in this process, with the seam's contract check as the boot runs it:
``checked`` (no stamp: the check reads vLLM's class sources) or ``stamped`` (the image's stamp,
written first by ``python -m worker vllm-contract --stamp`` in a process of its own, as the image's
build does). Run each in a fresh process, alternating:

    for i in 1 2 3 4 5; do for m in checked stamped; do python scripts/config_check_time.py $m; done; done

Prints one JSON line: the config's seconds. Leaves no stamp behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from worker.boot.plan import build_plan
from worker.config import load_settings
from worker.runtime import import_boot
from worker.tiny_models import ensure_tiny_models
from worker.vllm_internals import check


def main(mode: str) -> dict[str, Any]:
    if check.STAMP.exists():
        sys.exit(f"{check.STAMP} exists: remove it (this script writes, and removes, its own)")
    if mode == "stamped":  # as the image's build does, in a process of its own
        subprocess.run([sys.executable, "-m", "worker", "vllm-contract", "--stamp"], check=True, capture_output=True)
    import_boot()
    from worker.boot.launch import build_config

    settings = load_settings({"MODEL_NAME": "tiny:target"})
    ensure_tiny_models(settings.worker_cache_dir)
    plan = build_plan(settings, mode="serverless")
    try:
        started = time.perf_counter()
        build_config(plan)
        return {"mode": mode, "config_s": round(time.perf_counter() - started, 3)}
    finally:
        check.STAMP.unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("checked", "stamped"):
        sys.exit("usage: python scripts/config_check_time.py checked|stamped")
    print(json.dumps(main(sys.argv[1])))
