"""When a gateway process runs Python's full garbage collections, and how long every
collection held the process up.

Left to itself, Python starts a full collection whenever the objects that outlived the
young generations have grown by a quarter since the last one, and a full collection walks
every tracked object. A gateway's log index (every WAL object committed since the last WAL
collection pass, with its ranges) grows at the write rate: at 50 MB/s that meant a full
collection every few seconds, 20 to 50 ms each on a gateway a few seconds old and longer as
the index grows to a minute of commits, and every request in flight waited through each.

So the gateway takes the decision over: young collections stay automatic (they find the
garbage cycles, which nearly all die young), and a full collection runs every
FULL_COLLECTION_INTERVAL_S. A cycle among old objects waits at most that long to be
reclaimed; a gateway under connection churn leaves a few of those a minute.
"""

from __future__ import annotations

import asyncio
import gc
import time

FULL_COLLECTION_INTERVAL_S = 300.0
# gc's third threshold counts collections of the middle generation between full ones:
# this many never comes, so only `FullCollections.run` starts a full collection.
_NEVER = 1 << 30


class FullCollections:
    """Within `with`: no automatic full collections in this process, and each collection's
    pause observed into `pauses[generation]` (anything with `observe(seconds)`); `run`
    makes the full collections on schedule. Process-wide: one at a time."""

    def __init__(self, pauses: dict, interval_s: float = FULL_COLLECTION_INTERVAL_S):
        self.pauses = pauses
        self.interval_s = interval_s
        self._saved: tuple[int, int, int] | None = None
        self._started = 0.0

    def __enter__(self) -> FullCollections:
        self._saved = gc.get_threshold()
        gc.set_threshold(self._saved[0], self._saved[1], _NEVER)
        gc.callbacks.append(self._timed)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._timed)
        if self._saved is not None:
            gc.set_threshold(*self._saved)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            gc.collect()

    def _timed(self, phase: str, info: dict) -> None:
        # Runs inside the collector, wherever an allocation started it: nothing here may
        # take a lock (the interrupted code could hold it) or allocate much.
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = self.pauses.get(info["generation"])
        if pause is not None:
            pause.observe(time.perf_counter() - self._started)
