"""`queued.max.request.bytes`: the bytes of requests being read or handled, across every
connection of a gateway. A connection that announces a frame waits for room before reading
it, so when the bound is reached the gateway stops reading sockets instead of buffering
(the kernel's socket buffers hold the rest, and TCP slows the clients down).

One frame larger than the bound is still let through when nothing else is held, so a
request under socket.request.max.bytes can always be served. Frames of up to SMALL_FRAME
bytes (every request but large produce batches) are read without waiting: a client
stalling a large frame must not hold up the requests of everyone else, and what a
connection holds of small frames is bounded by the connection quotas.
"""

from __future__ import annotations

import asyncio

SMALL_FRAME = 1024 * 1024


class RequestMemory:
    def __init__(self, limit: int):
        self.limit = limit  # -1: no bound
        self.used = 0
        self._freed = asyncio.Event()

    @staticmethod
    def counts(size: int) -> bool:
        """Whether a frame of `size` bytes is held against the bound (acquire and release
        it); smaller ones are read at once."""
        return size > SMALL_FRAME

    async def acquire(self, size: int) -> None:
        if not self.counts(size):
            return
        while self.limit >= 0 and self.used and self.used + size > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.used += size

    def release(self, size: int) -> None:
        if not self.counts(size):
            return
        self.used -= size
        self._freed.set()
