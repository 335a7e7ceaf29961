"""A connection's protocol: request frames read off the socket with as few copies as the
socket allows.

asyncio's StreamReader takes every chunk the socket gives as a new bytes object, appends
it to its buffer and copies each frame out again (twice when more arrived behind it): up
to three copies of every byte produced, each in a fresh allocation, which was a fifth of
the event loop's time under large produce requests. Here a frame that did not arrive whole with its header is received
straight into the buffer it is handed on in (the socket's one copy, through
`BufferedProtocol`); small frames and headers go through a small stash of the
connection's own and are copied out once. A frame is a writable bytearray, so the engine
assigns offsets in place instead of copying each batch.

The stash bounds what a connection buffers ahead of the frame being handled: when it is
full, the socket is not read until the handler takes a frame (StreamReader's limit did the
same). It starts small, so a connection that sends one request at a time costs a few
kilobytes. A frame over IN_PLACE_BYTES is received in pieces of that size and joined, so a
client that announces a huge frame and stalls holds only what it sent.

`FrameWriter` is the answering side: the few StreamWriter calls the server makes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

# Bytes a connection buffers ahead (a few small requests): its stash starts at the least
# and doubles while a client sends faster than its frames are taken. Frames past half of
# the most that are still arriving are received directly into their own buffer, allocated
# whole up to IN_PLACE_BYTES (produce requests are up to a megabyte or two).
LEAST_STASH_BYTES = 4 * 1024
STASH_BYTES = 32 * 1024
DIRECT_BYTES = STASH_BYTES // 2
IN_PLACE_BYTES = 8 * 1024 * 1024


class FrameReader(asyncio.BufferedProtocol):
    """The protocol of one connection: `readexactly` for the server's loop, and a
    `FrameWriter` over the same transport for its answers, handed to `on_connect`."""

    def __init__(self, on_connect: Callable[[FrameReader, FrameWriter], Awaitable[None]]):
        self._on_connect = on_connect
        self._stash = bytearray(LEAST_STASH_BYTES)
        self._start = self._end = 0  # unread bytes: _stash[_start:_end]
        self._frame: bytearray | None = None  # a frame being received in place
        self._filled = 0
        self._waiter: asyncio.Future | None = None
        self._eof = False
        self._error: BaseException | None = None
        self._reading = True
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task | None = None
        self._writer: FrameWriter | None = None

    # ---- the transport's side --------------------------------------------------------

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._writer = FrameWriter(transport)
        self._task = asyncio.get_running_loop().create_task(self._on_connect(self, self._writer))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._filled:]
        if self._end == len(self._stash):
            self._compact()
            if self._end == len(self._stash):  # all unread, and less than the most
                self._grow(min(2 * len(self._stash), STASH_BYTES))
        return memoryview(self._stash)[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._filled += nbytes
            if self._filled == len(self._frame):
                # Whole: what the socket gives next goes to the stash, even before the
                # reader resumes (a frame has no room left to give).
                self._frame = None
                self._wake()
            return
        self._end += nbytes
        if self._end - self._start >= STASH_BYTES:
            self._pause()  # full: nothing more until a frame is taken
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # Keep a plain socket open for the answers still owed (a half-close); TLS cannot.
        return self._transport is not None and self._transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        if self._writer is not None:
            self._writer.lost()

    def pause_writing(self) -> None:
        if self._writer is not None:
            self._writer.paused = True

    def resume_writing(self) -> None:
        if self._writer is not None:
            self._writer.resumed()

    # ---- the server's side -----------------------------------------------------------

    async def readexactly(self, n: int) -> bytearray:
        """The next `n` bytes; asyncio.IncompleteReadError when the connection ends first."""
        if self._end - self._start < n and n > DIRECT_BYTES:
            if n <= IN_PLACE_BYTES:
                return await self._receive_in_place(n)
            # Received in pieces and joined: the buffer grows with what arrives, not with
            # what a client announces.
            pieces, left = [], n
            while left:
                pieces.append(await self._receive_in_place(min(left, IN_PLACE_BYTES)))
                left -= len(pieces[-1])
            return bytearray().join(pieces)
        while self._end - self._start < n:
            self._end_of_stream(n)
            if len(self._stash) - self._start < n:
                self._compact()
                if len(self._stash) < n:
                    self._grow(STASH_BYTES)
            self._resume()
            await self._wait()
        return self._take(n)

    def _take(self, n: int) -> bytearray:
        data = self._stash[self._start:self._start + n]
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        self._resume()
        return data

    async def _receive_in_place(self, n: int) -> bytearray:
        held = self._end - self._start
        if held >= n:
            return self._take(n)
        frame = bytearray(n)
        frame[:held] = memoryview(self._stash)[self._start:self._end]
        self._start = self._end = 0
        self._frame, self._filled = frame, held
        try:
            while self._frame is frame:
                self._end_of_stream(n, frame[:self._filled])
                self._resume()
                await self._wait()
        finally:
            self._frame = None
        return frame

    def _end_of_stream(self, n: int, partial: bytes | bytearray | None = None) -> None:
        if not self._eof:
            return
        if self._error is not None:
            raise ConnectionResetError(str(self._error)) from self._error
        if partial is None:
            partial = self._stash[self._start:self._end]
        raise asyncio.IncompleteReadError(bytes(partial), n)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _grow(self, size: int) -> None:
        self._stash += bytes(size - len(self._stash))

    def _compact(self) -> None:
        held = self._end - self._start
        self._stash[:held] = self._stash[self._start:self._end]
        self._start, self._end = 0, held

    def _pause(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _resume(self) -> None:
        if not self._reading and self._transport is not None and not self._transport.is_closing():
            self._reading = True
            self._transport.resume_reading()


class FrameWriter:
    """The answering side of a connection: what the server needs of a StreamWriter, with
    `drain` waiting while the transport's write buffer is over its high-water mark."""

    def __init__(self, transport: asyncio.Transport):
        self.transport = transport
        self.paused = False
        self._lost = False
        self._drained: asyncio.Future | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def writelines(self, data) -> None:
        self.transport.writelines(data)

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def close(self) -> None:
        self.transport.close()

    async def drain(self) -> None:
        """Return once the transport takes more (ConnectionResetError once it is gone)."""
        if self._lost:
            raise ConnectionResetError("connection lost")
        if not self.paused:
            return
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)  # shared: one waiter's cancellation is its own
        if self._lost:
            raise ConnectionResetError("connection lost")

    def resumed(self) -> None:
        self.paused = False
        self._release()

    def lost(self) -> None:
        self._lost = True
        self._release()

    def _release(self) -> None:
        if self._drained is not None:
            if not self._drained.done():
                self._drained.set_result(None)
            self._drained = None
