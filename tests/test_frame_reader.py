"""A connection's frame reader and writer over real loopback sockets, on asyncio's own
event loop and on uvloop (the gateway's): frames come out whole and in order however the
bytes arrive, a frame past the stash is received into its own writable buffer, a client
that sends faster than frames are taken is stopped at the stash, and the ends of a
connection surface as the errors the server expects."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest

from stratalog.gateway import frame_reader
from stratalog.gateway.frame_reader import DIRECT_BYTES, LEAST_STASH_BYTES, STASH_BYTES, FrameReader

pytestmark = pytest.mark.unit


def _loops():
    yield asyncio.run
    try:
        import uvloop
    except ImportError:
        return
    yield uvloop.run


@pytest.fixture(params=list(_loops()), ids=lambda run: run.__module__.split(".")[0])
def run(request):
    return request.param


async def _serve(on_connect):
    """A server of FrameReader connections on a free loopback port, and a connected
    client socket (blocking, used from a thread)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FrameReader(on_connect), "127.0.0.1", 0)
    client = socket.create_connection(server.sockets[0].getsockname())
    return server, client


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


async def _read_frames(reader, count):
    frames = []
    for _ in range(count):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        frames.append(await reader.readexactly(size))
    return frames


def test_frames_come_out_whole_however_the_bytes_arrive(run):
    bodies = [os.urandom(n) for n in (1, 9, DIRECT_BYTES, DIRECT_BYTES + 1, 3 * STASH_BYTES, 700_001, 5, 0)]
    stream = b"".join(_frame(b) for b in bodies)

    async def main():
        got = asyncio.get_running_loop().create_future()

        async def on_connect(reader, writer):
            got.set_result(await _read_frames(reader, len(bodies)))
            writer.close()

        server, client = await _serve(on_connect)
        # Odd-sized pieces with pauses: headers and frames cut anywhere.
        def send():
            for start in range(0, len(stream), 7919):
                client.sendall(stream[start:start + 7919])
        await asyncio.to_thread(send)
        frames = await asyncio.wait_for(got, 10)
        client.close()
        server.close()
        return frames

    frames = run(main())
    assert [bytes(f) for f in frames] == bodies
    assert all(isinstance(f, bytearray) for f in frames)  # writable: offsets go in in place


def test_a_frame_past_the_in_place_size_is_received_in_pieces(run, monkeypatch):
    monkeypatch.setattr(frame_reader, "IN_PLACE_BYTES", 100_000)
    body = os.urandom(350_007)

    async def main():
        got = asyncio.get_running_loop().create_future()

        async def on_connect(reader, writer):
            got.set_result(await _read_frames(reader, 2))
            writer.close()

        server, client = await _serve(on_connect)
        await asyncio.to_thread(client.sendall, _frame(body) + _frame(b"next"))
        frames = await asyncio.wait_for(got, 10)
        client.close()
        server.close()
        return frames

    assert [bytes(f) for f in run(main())] == [body, b"next"]


@pytest.mark.parametrize("first", [0, DIRECT_BYTES - 1], ids=["small-first", "stash-grown-first"])
def test_a_client_sending_ahead_is_stopped_at_the_stash(run, first):
    count = 80_000
    # 8 MB, past the kernel's buffers; a first frame that makes the stash grow at once
    many = _frame(bytes(first)) + b"".join(_frame(bytes(100)) for _ in range(count - 1))

    async def main():
        connected = asyncio.get_running_loop().create_future()

        async def on_connect(reader, writer):
            connected.set_result(reader)
            await asyncio.sleep(3600)

        server, client = await _serve(on_connect)
        sending = asyncio.create_task(asyncio.to_thread(client.sendall, many))
        reader = await asyncio.wait_for(connected, 10)
        assert len(reader._stash) <= STASH_BYTES
        for _ in range(500):
            if not reader._transport.is_reading():
                break
            await asyncio.sleep(0.01)
        paused = not reader._transport.is_reading()
        buffered = reader._end - reader._start
        # Taking frames lets it read again, and every frame arrives.
        frames = await asyncio.wait_for(_read_frames(reader, count), 30)
        await sending
        client.close()
        server.close()
        return paused, buffered, len(reader._stash), sum(f == bytes(100) for f in frames[1:])

    paused, buffered, stash, whole = run(main())
    assert paused
    assert buffered == STASH_BYTES == stash
    assert whole == count - 1


def test_a_connection_sending_one_request_at_a_time_keeps_a_small_stash(run):
    async def main():
        connected = asyncio.get_running_loop().create_future()

        async def on_connect(reader, writer):
            connected.set_result(reader)
            try:
                while True:
                    await _read_frames(reader, 1)
                    writer.writelines([b"."])
            except asyncio.IncompleteReadError:
                writer.close()

        server, client = await _serve(on_connect)
        reader = await asyncio.wait_for(connected, 10)
        for size in (30, 1000, 3000, 100):
            await asyncio.to_thread(client.sendall, _frame(bytes(size)))
            assert await asyncio.to_thread(client.recv, 1) == b"."
        client.close()
        server.close()
        return len(reader._stash)

    assert run(main()) == LEAST_STASH_BYTES


def test_the_ends_of_a_connection(run):
    async def main():
        outcomes = asyncio.Queue()

        async def on_connect(reader, writer):
            try:
                await _read_frames(reader, 1)
            except Exception as e:  # noqa: BLE001 - what the server would see
                await outcomes.put(e)
            writer.close()

        server, client = await _serve(on_connect)
        # A frame cut short by a half-close: IncompleteReadError, small or large.
        client.sendall(struct.pack(">i", 10) + b"abc")
        client.shutdown(socket.SHUT_WR)
        small = await asyncio.wait_for(outcomes.get(), 10)
        client.close()
        client = socket.create_connection(server.sockets[0].getsockname())
        client.sendall(struct.pack(">i", 5 * STASH_BYTES) + bytes(STASH_BYTES))
        client.shutdown(socket.SHUT_WR)
        large = await asyncio.wait_for(outcomes.get(), 10)
        client.close()
        # A reset mid-frame: a ConnectionError.
        client = socket.create_connection(server.sockets[0].getsockname())
        client.sendall(struct.pack(">i", 5 * STASH_BYTES) + bytes(100))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        reset = await asyncio.wait_for(outcomes.get(), 10)
        server.close()
        return small, large, reset

    small, large, reset = run(main())
    assert isinstance(small, asyncio.IncompleteReadError) and small.partial == b"abc"
    assert isinstance(large, asyncio.IncompleteReadError) and len(large.partial) == STASH_BYTES
    assert isinstance(reset, (ConnectionError, asyncio.IncompleteReadError))


def test_drain_waits_for_a_slow_reader_and_fails_once_it_is_gone(run):
    async def main():
        drained = asyncio.Queue()

        async def on_connect(reader, writer):
            chunk = bytes(1 << 20)
            try:
                for _ in range(64):  # far past the socket buffers
                    writer.writelines([chunk])
                    await writer.drain()
                await drained.put("drained")
            except ConnectionError as e:
                await drained.put(e)

        server, client = await _serve(on_connect)
        await asyncio.sleep(0.5)
        assert drained.empty()  # nobody reads: drain is waiting
        got = 0
        while got < 64 << 20:
            got += len(await asyncio.to_thread(client.recv, 1 << 20))
        first = await asyncio.wait_for(drained.get(), 10)
        client.close()
        # Gone while draining: ConnectionResetError.
        client = socket.create_connection(server.sockets[0].getsockname())
        await asyncio.sleep(0.5)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        second = await asyncio.wait_for(drained.get(), 10)
        server.close()
        return first, second

    first, second = run(main())
    assert first == "drained"
    assert isinstance(second, ConnectionError)
