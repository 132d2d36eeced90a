"""Engines for the benchmark's in-process parts (overhead, first_request, spec).

A measurement boots the engine it needs and shuts it down when done, so that GPU memory is free for
the next part. ``--smoke`` runs check the harness, not speed: there one engine per configuration
serves every part that asks for it (the overhead part's engine, the spec part's baseline and the
first-request part are the same configuration), and all are shut down at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.config import Settings

if TYPE_CHECKING:
    from worker.engine import Engine

__all__ = ["EnginePool"]


class EnginePool:
    def __init__(self, *, share: bool) -> None:
        self.share = share
        self._shared: dict[str, Engine] = {}
        self.num_boots = 0

    async def get(self, settings: Settings) -> Engine:
        """An engine for ``settings``: booted now, or with ``share`` the one booted before."""
        key = settings.model_dump_json()
        if self.share and key in self._shared:
            return self._shared[key]
        engine = await self.boot(settings)
        if self.share:
            self._shared[key] = engine
        return engine

    async def boot(self, settings: Settings) -> Engine:
        """An engine of its own, never shared (an A/A twin), shut down by :meth:`release`."""
        from worker.runtime import boot_engine

        self.num_boots += 1
        return await boot_engine(settings, mode="serverless")

    def release(self, engine: Engine) -> None:
        """Done with ``engine``: shut down now, unless shared (then at :meth:`close`)."""
        if engine not in self._shared.values():
            engine.shutdown()

    def close(self) -> None:
        for engine in self._shared.values():
            engine.shutdown()
        self._shared.clear()
