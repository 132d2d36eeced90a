"""Unpack wheels into one folder on a machine without pip or network (the GPU bench host): the
packages land in DEST (put it on PYTHONPATH), console scripts and binaries in DEST/bin. Only
for wheels without install-time steps (pure packages, prebuilt binaries).

    python3 scripts/unpack_wheels.py DEST WHEEL...
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def unpack(dest: Path, wheels: list[Path]) -> None:
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.endswith("/"):
                    continue
                parts = member.split("/")
                relative = member
                if len(parts) > 2 and parts[0].endswith(".data"):
                    if parts[1] == "scripts":  # e.g. py-spy's binary
                        script = dest / "bin" / parts[-1]
                        script.write_bytes(archive.read(member))
                        script.chmod(0o755)
                        continue
                    relative = "/".join(parts[2:])  # purelib / platlib: the package root
                target = dest / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(member))
        print(f"unpacked {wheel.name}")


if __name__ == "__main__":
    unpack(Path(sys.argv[1]), [Path(w) for w in sys.argv[2:]])
