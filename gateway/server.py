"""With `frame_reader` (a connection's protocol), the only module that touches sockets:
frames in, handlers, frames out.

Per connection, requests are handled one at a time in arrival order (so two produce
requests to one partition append in the order they were sent), but a handler may return
a `Deferred` — the part of its work that only waits (a WAL commit for `acks=all`, a fetch
long poll) — and the next request is read while it waits. Responses are written strictly
in request order, as the protocol requires, so each request's context carries an event
set when the next one arrives: a fetch long poll answers then instead of making it wait.

A handler that raises, a deferred part that raises, or a response that does not encode
(see `EncodeError`) is logged with its traceback and answered with UNKNOWN_SERVER_ERROR
where the response has a top-level error code; otherwise the connection is closed, which
clients treat as a retriable network error. Either way the gateway keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
import time
from dataclasses import dataclass, field

from .auth.listeners import Listener
from .auth.session import Session
from .auth.tls import ServerTls, map_principal, subject_dn
from .connection_limits import ConnectionLimits
from .frame_reader import FrameReader, FrameWriter
from .request_memory import RequestMemory
from .errors import serving
from .handlers import load_handlers
from .handlers.registry import HANDLERS, NO_RESPONSE, ApiKey, Deferred, RequestContext, supported_versions
from .protocol.error_codes import ErrorCode
from .protocol.frames import UnknownApi, decode_request, encode_response_parts, error_response
from .protocol.wire import DecodeError
from .quotas.rules import REQUEST_PERCENTAGE
from .quotas.throttling import client_backs_off, with_throttle
from .stopping import cancel_and_wait

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64  # responses a connection may have pending before we stop reading
# What a connection on a SASL listener may send before it has authenticated.
BEFORE_AUTHENTICATION = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


def _failure_response(ctx: RequestContext, what: str) -> dict | None:
    """Log the exception being handled, with its traceback and request; the response to
    send instead, or None to close the connection (see the module docstring)."""
    body = error_response(ctx.api_key, ctx.version, ErrorCode.UNKNOWN_SERVER_ERROR)
    log.exception("%s: %s; %s", ctx, what,
                  "closing the connection" if body is None else "answered UNKNOWN_SERVER_ERROR")
    return body


@dataclass
class _Activity:
    """When a connection last sent a request or got an answer, and how many answers it
    still awaits (a connection awaiting one is never idle)."""

    last: float = field(default_factory=time.monotonic)
    pending: int = 0
    muted_until: float = 0.0  # a throttled connection is not read from until then (KIP-219)
    # When the frame being read must be whole (request.read.timeout.ms after its size came;
    # inf between frames), and its size: the sweeper closes a connection past it. One
    # sweep for all connections costs less than a timer per frame.
    frame_due: float = math.inf
    frame_size: int = 0

    def mute(self, throttle_ms: int) -> None:
        if throttle_ms > 0:
            self.muted_until = max(self.muted_until, time.monotonic() + throttle_ms / 1000)


class GatewayServer:
    """One listener: its socket, its TLS, and the connections accepted on it.

    `limits` (shared by every listener of the gateway) refuses connections past Kafka's
    connection quotas; `idle_ms` closes connections idle that long (connections.max.idle.ms).
    """

    def __init__(self, broker, listener: Listener, *, max_request_bytes: int, metrics=None,
                 tls: ServerTls | None = None, limits: ConnectionLimits | None = None,
                 idle_ms: int | None = None, memory: RequestMemory | None = None,
                 read_timeout_ms: int = 30_000):
        load_handlers()
        self.broker = broker
        self.listener = listener
        self.host = listener.host
        self.port = listener.port
        self.max_request_bytes = max_request_bytes
        self.metrics = metrics
        self.tls = tls if listener.tls else None
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[asyncio.Task] = set()
        self._supported = supported_versions()
        self.limits = limits
        self.idle_ms = idle_ms
        self.memory = memory or RequestMemory(-1)
        self.read_timeout_s = read_timeout_ms / 1000
        self._activity: dict[asyncio.Task, tuple[_Activity, FrameWriter]] = {}
        self._sweeper: asyncio.Task | None = None

    async def bind(self) -> None:
        """Bind the listener (so a port of 0 is resolved) without accepting clients yet."""
        self._server = await asyncio.get_running_loop().create_server(
            lambda: FrameReader(self._accept), self.host, self.port, reuse_address=True,
            start_serving=False, ssl=self.tls.context if self.tls else None)
        self.port = self._server.sockets[0].getsockname()[1]
        self.listener = Listener(self.listener.name, self.listener.protocol, self.host, self.port)

    async def start(self) -> None:
        if self._server is None:
            await self.bind()
        await self._server.start_serving()
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._close_idle(), name=f"idle-{self.port}")

    async def _close_idle(self) -> None:
        """Close connections idle for connections.max.idle.ms, and those whose request
        frame did not arrive whole within request.read.timeout.ms (checked a few times per
        bound, so a stalled frame is closed at most a quarter of its bound late)."""
        idle_s = self.idle_ms / 1000 if self.idle_ms is not None else math.inf
        while True:
            await asyncio.sleep(min(max(min(idle_s, self.read_timeout_s) / 4, 0.05), 30.0))
            now = time.monotonic()
            for activity, writer in list(self._activity.values()):
                if activity.frame_due < now:
                    peer = writer.get_extra_info("peername")
                    log.warning("%s: closing, a %d-byte request frame did not arrive within %.0fs",
                                f"{peer[0]}:{peer[1]}" if peer else "?", activity.frame_size,
                                self.read_timeout_s)
                    writer.transport.abort()
                elif activity.pending == 0 and now - activity.last >= idle_s:
                    log.debug("closing a connection idle for %.1fs", now - activity.last)
                    writer.transport.abort()

    def requests_in_flight(self) -> int:
        """Requests read and not yet answered, over this listener's connections."""
        return sum(activity.pending for activity, _ in self._activity.values())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(list(self._connections))
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: FrameReader, writer: FrameWriter) -> None:
        task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if peer else "?"
        ip = peer[0] if peer else "?"
        if self.limits is not None:
            refused = self.limits.admit(ip)
            if refused is not None:
                log.debug("%s: connection refused by %s", peer_s, refused)
                writer.transport.abort()
                return
        self._connections.add(task)
        activity = _Activity()
        self._activity[task] = (activity, writer)
        session = Session(self.listener)
        if self.tls is not None:
            self.tls.refresh()  # a renewed certificate serves the next handshake
            dn = subject_dn(writer.get_extra_info("peercert"))
            if dn is not None:
                session.principal = f"User:{map_principal(self.tls.rules, dn)}"
        try:
            await self._serve(reader, writer, peer_s, session, activity)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - one broken connection must not take the gateway down
            log.exception("connection %s failed", peer_s)
        finally:
            self._connections.discard(task)
            self._activity.pop(task, None)
            if self.limits is not None:
                self.limits.release(ip)
            writer.close()

    async def _serve(self, reader: FrameReader, writer: FrameWriter, peer: str,
                     session: Session, activity: _Activity) -> None:
        responses: asyncio.Queue = asyncio.Queue(MAX_IN_FLIGHT)
        write_task = asyncio.create_task(self._write_responses(responses, writer, peer, activity))
        current = asyncio.current_task()
        behind = asyncio.Event()  # set when the request after the last one read arrives
        try:
            while not write_task.done():
                if current is not None and current.cancelling():
                    # The gateway is stopping, but a call the request awaited ended at the
                    # moment it was cancelled and swallowed it (asyncio.wait_for before
                    # Python 3.12 does): without this the connection would outlive the stop.
                    return
                muted = activity.muted_until - time.monotonic()
                if muted > 0:
                    await asyncio.sleep(muted)
                head = await reader.readexactly(4)
                behind.set()
                behind = asyncio.Event()
                (size,) = struct.unpack(">i", head)
                if size < 8 or size > self.max_request_bytes:
                    log.warning("%s: closing, request frame of %d bytes (limit %d)",
                                peer, size, self.max_request_bytes)
                    return
                held = self.memory.counts(size)
                if held:
                    await self.memory.acquire(size)
                try:
                    activity.frame_due, activity.frame_size = time.monotonic() + self.read_timeout_s, size
                    frame = await reader.readexactly(size)  # the sweeper aborts it past frame_due
                    activity.frame_due = math.inf
                    activity.last = time.monotonic()
                    activity.pending += 1
                    if session.raw_tokens:
                        item = await self._raw_sasl(bytes(frame), peer, session)
                    else:
                        item = await self._handle(frame, peer, session, behind)
                        if item is not None:
                            activity.mute(item[3].throttle_ms)
                    del frame
                finally:
                    if held:
                        self.memory.release(size)
                if item is None:
                    return  # garbage: close the connection
                await responses.put(item)
                if session.closing:
                    return  # answered (a failed authentication); nothing more is read
        finally:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # The gateway is stopping: answers still being waited for (a long poll, a
                # client that reads nothing) must not hold the stop up. Cancelled again if
                # need be: a fetch long poll whose data arrived with the cancellation
                # swallows it (asyncio.wait_for before 3.12), answers, and would then wait
                # for the next request for ever (the previous release's stop hung so).
                await cancel_and_wait([write_task], retry_s=0.1)
            else:
                await responses.put(None)
                try:
                    await write_task
                except (Exception, asyncio.CancelledError):  # noqa: BLE001
                    pass

    async def _handle(self, frame: bytes | bytearray, peer: str, session: Session,
                      behind: asyncio.Event | None = None):
        started = time.perf_counter()
        try:
            req = decode_request(frame, self._supported)
        except UnknownApi as e:
            log.warning("%s: closing, %s", peer, e)
            return None
        except DecodeError as e:
            log.warning("%s: closing, malformed request: %s", peer, e)
            return None
        if (session.expires_ms is not None and req.api_key not in BEFORE_AUTHENTICATION
                and session.expired(self.broker.now_ms())):
            log.info("%s: closing, the credentials of %s expired without re-authentication", peer,
                     session.principal)
            return None
        if not session.authenticated and req.api_key not in BEFORE_AUTHENTICATION:
            log.warning("%s: closing, %s before authenticating on %s listener %s", peer, req.api_name,
                        session.listener.protocol, session.listener.name)
            return None
        handler = HANDLERS[req.api_key]
        ctx = RequestContext(self.broker, req.api_key, req.api_version, req.client_id, peer,
                             req.correlation_id, session, request_bytes=len(frame),
                             request_behind=behind)
        token = serving.set(ctx)
        quotas = getattr(self.broker, "quotas", None)
        # The handler's event-loop time is measured only while some client quota is set:
        # without one nothing reads it, and timing each step costs more than most steps.
        coro = handler.fn(ctx, req.body)
        timed = (LoopTime(coro) if quotas is not None and quotas.any_set
                 and req.api_key not in BEFORE_AUTHENTICATION else None)
        try:
            result = await (coro if timed is None else timed)
        except Exception:  # noqa: BLE001 - a handler's bug fails its request, not the gateway
            result = _failure_response(ctx, "handler failed")
            if result is None:
                return None
        finally:
            serving.reset(token)
        if timed is not None and result is not NO_RESPONSE:
            # request_percentage: the share of the event loop's time this client's requests
            # take, in percent of a second per second (Kafka: of one request thread's time);
            # like Kafka, not for acks=0 produce requests, which have no answer to carry it.
            ctx.throttle(quotas.record(REQUEST_PERCENTAGE, session.principal, req.client_id,
                                       timed.seconds * 100))
        # Only the header goes into the queue: the request body (a produce request's records
        # are a view of its whole frame) must not live until the response is written.
        return (req.api_key, req.api_name, req.correlation_id, ctx, result, started)

    async def _raw_sasl(self, token: bytes, peer: str, session: Session) -> bytes | None:
        """After a SaslHandshake v0 the SASL tokens travel framed by a length alone (no
        request header): a failed step cannot be answered, so it closes the connection."""
        try:
            broker = self.broker
            return await session.step(broker.store, token, oauth=broker.oauth, now_ms=broker.now_ms(),
                                      reauth_ms=broker.config["connections.max.reauth.ms"])
        except Exception as e:  # noqa: BLE001 - AuthenticationFailed, IllegalSaslState
            log.warning("%s: SASL/%s authentication failed: %s", peer, session.mechanism, e)
            return None

    async def _write_responses(self, responses: asyncio.Queue, writer: FrameWriter,
                               peer: str, activity: _Activity) -> None:
        """Answer in request order. Answers that are ready together (every acks=all produce
        request of one WAL flush) go out in one write: a system call costs as much here as
        encoding a small response."""
        out: list = []
        gathered = 0  # bytes in `out`, counted as answers are added (not summed again each time)
        item = _NOTHING
        try:
            while True:
                if item is _NOTHING:
                    await self._send(out, writer)
                    gathered = 0
                    item = await responses.get()
                if item is None:
                    return
                if out and _must_wait(item):
                    await self._send(out, writer)
                    gathered = 0
                before = len(out)
                try:
                    if not await self._answer(item, writer, out, activity):
                        return
                finally:
                    activity.pending -= 1
                    activity.last = time.monotonic()
                gathered += sum(map(len, out[before:]))
                if responses.empty() or gathered >= COALESCE_BYTES:
                    item = _NOTHING
                else:
                    item = responses.get_nowait()
        finally:
            if out and not writer.is_closing():
                _write(out, writer)  # what was answered before the end still goes out

    @staticmethod
    async def _send(out: list, writer: FrameWriter) -> None:
        if out:
            _write(out, writer)
            out.clear()
            await writer.drain()

    async def _answer(self, item, writer: FrameWriter, out: list, activity: _Activity) -> bool:
        """Encode one answer into `out` (waiting for its deferred part first); False when
        the connection was closed instead."""
        if isinstance(item, bytes):  # a raw SASL token (SaslHandshake v0)
            out += (struct.pack(">i", len(item)), item)
            return True
        api_key, api_name, correlation_id, ctx, result, started = item
        if isinstance(result, Deferred):
            token = serving.set(ctx)
            try:
                result = await result.awaitable
            except Exception:  # noqa: BLE001
                result = _failure_response(ctx, "failed")
                if result is None:
                    writer.close()
                    return False
            finally:
                serving.reset(token)
        if result is NO_RESPONSE:
            return True
        if ctx.throttle_ms:
            result = with_throttle(result, ctx.throttle_ms)
            activity.mute(ctx.throttle_ms)
            if not client_backs_off(api_key, ctx.version):
                await asyncio.sleep(ctx.throttle_ms / 1000)  # an old client: the broker holds it back
        try:
            data = encode_response_parts(api_key, ctx.version, correlation_id, result)
        except Exception:  # noqa: BLE001 - EncodeError: the handler's response is malformed
            result = _failure_response(ctx, "response does not encode")
            if result is None:
                writer.close()
                return False
            data = encode_response_parts(api_key, ctx.version, correlation_id, result)
        out += data
        if self.metrics is not None:
            self.metrics.observe_request(api_name, time.perf_counter() - started)
        return True


_NOTHING = object()  # no answer taken from the queue yet


class LoopTime:
    """Awaits a coroutine and adds up the time the event loop spent running it (its steps
    between awaits), not the time it waited: the request quota's measure."""

    __slots__ = ("coro", "seconds")

    def __init__(self, coro):
        self.coro = coro
        self.seconds = 0.0

    def __await__(self):
        coro, send, error = self.coro, None, None
        while True:
            started = time.perf_counter()
            try:
                step = coro.throw(error) if error is not None else coro.send(send)
            except StopIteration as done:
                self.seconds += time.perf_counter() - started
                return done.value
            self.seconds += time.perf_counter() - started
            send, error = None, None
            try:
                send = yield step
            except BaseException as e:  # noqa: BLE001 - cancellation and errors go to the coroutine
                error = e
COALESCE_BYTES = 1024 * 1024  # answers gathered into one write at most (a Fetch may be larger alone)
# uvloop's TLS transport encrypts all it is handed into one growing memory buffer before
# sending any of it; handed a multi-megabyte Fetch at once, it spends as long growing,
# copying and clearing that buffer as encrypting. Answers go to it in pieces of this size.
TLS_WRITE_BYTES = 256 * 1024


def _write(out: list, writer: FrameWriter) -> None:
    if writer.get_extra_info("ssl_object") is None:
        writer.writelines(out)
    else:
        for piece in tls_pieces(out, TLS_WRITE_BYTES):
            writer.writelines(piece)


def tls_pieces(parts: list, limit: int):
    """`parts` as lists of at most `limit` bytes each (a larger part is cut into views)."""
    piece: list = []
    size = 0
    for part in parts:
        n = len(part)
        chunks = [part] if n <= limit else [memoryview(part)[i:i + limit] for i in range(0, n, limit)]
        for chunk in chunks:
            if piece and size + len(chunk) > limit:
                yield piece
                piece, size = [], 0
            piece.append(chunk)
            size += len(chunk)
    if piece:
        yield piece


def _must_wait(item) -> bool:
    """Whether answering this item waits (a deferred part not done yet): what is already
    encoded goes out first."""
    if isinstance(item, bytes):
        return False
    result = item[4]
    if not isinstance(result, Deferred):
        return False
    return not (isinstance(result.awaitable, asyncio.Future) and result.awaitable.done())
