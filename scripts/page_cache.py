"""Evict a model's weight files from the page cache, or report how much of them is resident.

    python3 scripts/page_cache.py evict DIR      # sync, POSIX_FADV_DONTNEED on every weight file, then residency
    python3 scripts/page_cache.py residency DIR  # the share of each weight file in the page cache (mincore)

Prints one JSON line: {"files": N, "bytes": B, "resident": <share of all pages>}. For checking a
cold-disk boot by hand (the GPU hosts have no fincore); the coldstart-real stage evicts through
the bench's own COLDSTART_EVICT_WEIGHTS.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from worker.boot import prefetch


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("evict", "residency"):
        print(__doc__, file=sys.stderr)
        return 2
    files = prefetch.weight_files(Path(argv[1]))
    if argv[0] == "evict":
        for path in files:
            prefetch.evict(path)
    num_bytes = sum(path.stat().st_size for path in files)
    print(
        json.dumps({"files": len(files), "bytes": num_bytes, "resident": round(prefetch.resident_fraction(files), 4)})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
