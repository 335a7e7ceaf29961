"""A fault-injecting HTTP proxy in front of an S3 endpoint (moto), for chaos tests.

The proxy runs its own asyncio loop in a daemon thread, so synchronous tests (and the
gateway processes pointed at it with `--s3-endpoint`) can use it while the test thread
drives clients. Each request is classified as one S3 operation:

    PUT     object and multipart-part uploads (HTTP PUT)
    GET     object reads (GET on a key)
    HEAD    object size look-ups
    LIST    ListObjectsV2 (GET on the bucket)
    DELETE  DeleteObject and DeleteObjects (POST ?delete)
    POST    anything else sent with POST (multipart create and complete)

`FaultRule`s say what to do with a share of an operation's requests, optionally only for
keys containing a substring, and optionally only so many times:

    500         answer 500 InternalError (not forwarded)
    503         answer 503 SlowDown (not forwarded)
    drop        close the connection without forwarding or answering
    lost_reply  forward (so the store applies it), then close without answering
    stall       hold the request unanswered and unforwarded until the client gives up
                (its read timeout) or `release()` / `stop()`; then close
    hold        hold the request until `release()`, then forward it (even if the client
                gave up meanwhile) and answer

The first rule (in order) whose operation and key match and whose coin toss says yes
decides; a request no rule takes is forwarded. Coin tosses come from a seeded RNG so a
run is repeatable for a given request order. Connections are one request each (the proxy
answers `Connection: close`), which keeps the forwarding byte-exact and simple.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

OPERATIONS = ("PUT", "GET", "HEAD", "LIST", "DELETE", "POST")
ACTIONS = ("500", "503", "drop", "lost_reply", "stall", "hold")
_HEAD_LIMIT = 64 * 1024


@dataclass
class FaultRule:
    """Apply `action` to a `fraction` of `ops` requests whose key contains `key_contains`,
    at most `count` times (None: no limit)."""

    ops: tuple[str, ...]
    action: str
    fraction: float = 1.0
    count: int | None = None
    key_contains: str = ""
    fired: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.ops = tuple(o.upper() for o in self.ops)
        bad = [o for o in self.ops if o not in OPERATIONS]
        if bad or not self.ops:
            raise ValueError(f"ops must be some of {OPERATIONS}, got {self.ops}")
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")
        if self.count is not None and self.count < 0:
            raise ValueError(f"count must be >= 0 or None, got {self.count}")


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    op: str
    key: str  # object key within the bucket ("" for bucket-level requests)


def classify(method: str, target: str) -> tuple[str, str]:
    """(operation, object key) of a path-style S3 request line's method and target."""
    parts = urlsplit(target)
    path = unquote(parts.path).lstrip("/")
    bucket, _, key = path.partition("/")
    query = parts.query
    if method == "POST":
        return ("DELETE" if query.split("&")[0].split("=")[0] == "delete" else "POST"), key
    if method == "GET" and not key:
        return "LIST", ""
    if method in ("PUT", "GET", "HEAD", "DELETE"):
        return method, key
    raise ValueError(f"unexpected S3 request {method} {target}")


class FaultProxy:
    """The proxy; `start()` returns self with `.endpoint` set (http://127.0.0.1:PORT)."""

    def __init__(self, upstream: str, *, seed: int = 0, connect_timeout: float = 10.0):
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.endpoint = ""
        self._rng = random.Random(seed)
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._connect_timeout = connect_timeout
        self.requests: Counter[str] = Counter()  # by operation
        self.faults: Counter[tuple[str, str]] = Counter()  # by (operation, action)
        self.log: list[tuple[Request, str]] = []  # every request and what was done to it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._release: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()

    # ---- control (any thread) ------------------------------------------------------------

    def set_rules(self, *rules: FaultRule) -> None:
        """Replace the rules; requests already held keep waiting for release()."""
        with self._lock:
            self._rules = list(rules)

    def clear(self) -> None:
        self.set_rules()

    def release(self) -> None:
        """Let every held or stalled request go (held ones are forwarded)."""
        loop, ev = self._loop, self._release
        if loop is not None and ev is not None:
            def swap() -> None:
                ev.set()
                self._release = asyncio.Event()
            loop.call_soon_threadsafe(swap)

    def held(self) -> int:
        """Requests currently held or stalled."""
        with self._lock:
            return self._waiting

    def count(self, op: str | None = None, action: str | None = None) -> int:
        """Faults injected, for one operation and/or action."""
        with self._lock:
            return sum(n for (o, a), n in self.faults.items()
                       if (op is None or o == op) and (action is None or a == action))

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        ready = threading.Event()
        self._waiting = 0

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def boot() -> None:
                self._release = asyncio.Event()
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
                port = self._server.sockets[0].getsockname()[1]
                self.endpoint = f"http://127.0.0.1:{port}"

            loop.run_until_complete(boot())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            self._server.close()
            self._release.set()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the proxy itself (proxy thread) ---------------------------------------------------

    def _decide(self, req: Request) -> str | None:
        with self._lock:
            self.requests[req.op] += 1
            action = None
            for rule in self._rules:
                if req.op not in rule.ops or rule.key_contains not in req.key:
                    continue
                if rule.count is not None and rule.fired >= rule.count:
                    continue
                if self._rng.random() >= rule.fraction:
                    continue
                rule.fired += 1
                action = rule.action
                self.faults[(req.op, action)] += 1
                break
            self.log.append((req, action or "forward"))
            return action

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _read_body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        """The request body exactly as sent (Content-Length or chunked framing kept)."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = bytearray()
            while True:
                size_line = await reader.readuntil(b"\r\n")
                out += size_line
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    while True:  # trailers, then the empty line
                        line = await reader.readuntil(b"\r\n")
                        out += line
                        if line == b"\r\n":
                            return bytes(out)
                out += await reader.readexactly(size + 2)
        return await reader.readexactly(int(headers.get("content-length", "0") or 0))

    async def _wait(self, reader: asyncio.StreamReader | None) -> None:
        """Until release()/stop(), or (given the reader) until the client closes its end."""
        waits = {asyncio.ensure_future(self._release.wait())}
        if reader is not None:
            waits.add(asyncio.ensure_future(reader.read(1)))
        with self._lock:
            self._waiting += 1
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            with self._lock:
                self._waiting -= 1
            for w in waits:
                w.cancel()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > _HEAD_LIMIT:
            return
        lines = head.decode("latin-1").split("\r\n")[:-2]
        request_line, header_lines = lines[0], lines[1:]
        method, target, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        op, key = classify(method, target)
        action = self._decide(Request(method, target, op, key))
        if headers.get("expect", "").lower() == "100-continue" and action not in ("500", "503"):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if action in ("500", "503"):
            code = "SlowDown" if action == "503" else "InternalError"
            text = "Please reduce your request rate." if action == "503" else "Injected failure."
            body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                    f"<Message>{text}</Message><RequestId>fault-proxy</RequestId></Error>").encode()
            reason = "Slow Down" if action == "503" else "Internal Server Error"
            writer.write(f"HTTP/1.1 {action} {reason}\r\nContent-Type: application/xml\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            return
        if action == "drop":
            return
        body = await self._read_body(reader, headers)
        if action == "stall":
            await self._wait(reader)
            return
        if action == "hold":
            # Forwarded on release even if the client gave up meanwhile: a write that lands
            # late, after its sender stopped waiting, is what a hung connection can do.
            await self._wait(None)
        response = await self._forward(request_line, header_lines, body)
        if action == "lost_reply":
            return
        resp_head, _, resp_body = response.partition(b"\r\n\r\n")
        kept = [line for line in resp_head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        writer.write(b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n" + resp_body)
        await writer.drain()

    async def _forward(self, request_line: str, header_lines: list[str], body: bytes) -> bytes:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(*self.upstream), self._connect_timeout)
        try:
            kept = [line for line in header_lines
                    if line.split(":")[0].strip().lower() not in ("connection", "expect")]
            up_writer.write(("\r\n".join([request_line, *kept, "Connection: close"])
                             + "\r\n\r\n").encode("latin-1") + body)
            await up_writer.drain()
            return await up_reader.read()  # the upstream closes after its one response
        finally:
            up_writer.close()
