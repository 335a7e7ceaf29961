"""An in-memory copy of something the coordinator keeps (ACLs, client quotas), loaded at
start and again whenever a watch says it changed.

Each round opens the watch before loading, so no change can fall between the load and
the watch. When the coordinator fails, the copy stays as last loaded and following starts
over after a pause: a gateway keeps enforcing what it last knew rather than nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

RETRY_S = 1.0


class Following:
    def __init__(self, what: str, watch: Callable[[], Awaitable[Any]],
                 reload: Callable[[], Awaitable[None]]):
        self.what = what  # for logs: "ACL", "client quota"
        self._watch = watch
        self._reload = reload
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Load once (a coordinator error is raised, for the start to retry), then follow."""
        await self._reload()
        self._task = asyncio.create_task(self._follow(), name=f"{self.what} watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _follow(self) -> None:
        while True:
            watch = None
            try:
                watch = await self._watch()
                await self._reload()
                async for _ in watch:
                    await self._reload()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - coordinator trouble: keep the copy, retry
                log.warning("following %s changes failed (keeping the last ones): %s", self.what, e)
                await asyncio.sleep(RETRY_S)
            finally:
                if watch is not None:
                    await watch.close()
