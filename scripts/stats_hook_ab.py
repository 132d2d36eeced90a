"""A/B of the exact-stats hook's own code between worker trees, in one process over the same steps.

Between processes the stats path's figures spread more than a small change moves them (on the
H200 host vLLM's own tracking, the same code, ranged 30-65 µs at 256 streams in one afternoon),
so this loads ``worker/stop_triggers.py`` and ``worker/spec_scheduler.py`` from each tree side by
side and times each tree's ``update_from_output`` hook after vLLM's update has returned (the
stand-in engine of the bench's ``stats_path`` part: vLLM's ``Request`` objects, the documentation
text and tokenizer), alternating trees within every round:

    .venv/bin/python scripts/stats_hook_ab.py --batch 256 --rounds 9 ../old-tree .

Prints, per stop case and tree, min / median / max µs per step and the request-steps that got a
snapshot (equal across trees, or one of them snapshots differently).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

_MODULES = ("worker.stop_triggers", "worker.spec_scheduler")


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, tokenizer: Any) -> tuple[type, Any]:
    """The tree's hook class and its trigger table; its modules under the usual names while they
    load (the scheduler imports the trigger module by name), the caller's afterwards."""
    saved = {name: sys.modules.pop(name, None) for name in _MODULES}
    try:
        triggers = _load(root / "worker/stop_triggers.py", _MODULES[0])
        scheduler = _load(root / "worker/spec_scheduler.py", _MODULES[1])
    finally:
        for name, module in saved.items():
            if module is not None:
                sys.modules[name] = module
    return scheduler.SpecMetricsSnapshots, triggers.StopTriggers.from_tokenizer(tokenizer)


def _time_hook(
    hook: type, triggers: Any, stop: str | None, stream: list[int], size: int, steps: int
) -> tuple[float, int]:
    """µs per step of the hook after the stand-in update returns, and the snapshots it attached."""
    from worker.tools.bench.stats_path import stand_in_engine

    Core, listed, flat = stand_in_engine(size, k=4, steps=steps, stop=stop, stream=stream)
    hooked: Any = type("Hooked", (hook, Core), {})()
    hooked._triggers, hooked._triggers_started = triggers, True
    for request in listed:
        hooked.add_request(request)
    elapsed = snapshots = 0
    for step in range(steps):
        hooked.step = step
        hooked.update_from_output(None, None)
        elapsed += time.perf_counter_ns() - hooked.returned  # the clock starts when vLLM's update returns
        snapshots += sum(o.spec_decode_metrics is not None for o in flat)
    return elapsed / steps / 1000, snapshots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path, help="worker trees (each holds worker/)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    from worker.tools.bench.stats_path import STOP_CASES, _text_and_tokenizer, _without

    text, tokenizer = _text_and_tokenizer()
    hooks = {str(root): _tree(root, tokenizer) for root in args.trees}
    streams = {stop: tokenizer.encode(_without(text, stop)).ids for stop in STOP_CASES.values()}
    times: dict[tuple[str, str], list[float]] = {}
    snapshots: dict[tuple[str, str], set[int]] = {}
    for _ in range(args.rounds):
        for label, stop in STOP_CASES.items():
            for name, (hook, triggers) in hooks.items():
                us, count = _time_hook(hook, triggers, stop, streams[stop], args.batch, args.steps)
                times.setdefault((label, name), []).append(us)
                snapshots.setdefault((label, name), set()).add(count)
    for (label, name), values in times.items():
        print(
            f"{label:10} {name:30} min {min(values):7.1f}  median {statistics.median(values):7.1f}  "
            f"max {max(values):7.1f} µs/step  snapshots {sorted(snapshots[label, name])}"
        )


if __name__ == "__main__":
    main()
