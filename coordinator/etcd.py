"""The `KV` boundary over an etcd v3 cluster, through aetcd's asyncio gRPC client.

Requests are built from aetcd's protobuf messages and sent on its stubs (aetcd's helpers do
not expose range filters such as min_mod_revision). While etcd cannot be reached every call
raises `CoordinatorUnavailable`; the client is then dropped and the next call dials the next
endpoint afresh, so service resumes as soon as a member is back.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Sequence

import aetcd
import grpc
from aetcd import rpc, watcher

from stratalog.coordinator.kv import (
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, Compare, CoordinatorError,
    CoordinatorUnavailable, Delete, DeletePrefix, Event, Op, Put, RequestTooLarge, Watch,
    check_txn, prefix_end)

log = logging.getLogger(__name__)

_TARGETS = {"value": rpc.Compare.VALUE, "mod": rpc.Compare.MOD,
            "version": rpc.Compare.VERSION}
_RESULTS = {"==": rpc.Compare.EQUAL, "!=": rpc.Compare.NOT_EQUAL, "<": rpc.Compare.LESS,
            ">": rpc.Compare.GREATER}
_UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED}
_CHANNEL_OPTIONS = {
    "grpc.max_receive_message_length": 512 * 1024 * 1024,
    "grpc.max_send_message_length": 64 * 1024 * 1024,
    # gRPC's default reconnect backoff grows to minutes; etcd restarts take seconds.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def parse_endpoints(spec: str) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` -> [(host, port)]; ValueError with the bad part named."""
    out = []
    for part in spec.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad etcd endpoint {part.strip()!r}: expected host:port")
        out.append((host.strip("[]"), int(port)))
    return out


def _range_end(prefix: str) -> bytes:
    end = prefix_end(prefix.encode())
    return b"\0" if end is None else end  # etcd: "\0" as range_end means "to the end"


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach a secured etcd: TLS (a CA bundle; a client certificate and key for
    etcd's --client-cert-auth) and/or an etcd user."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    username: str | None = None
    password: str | None = None

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.ca_file or self.cert_file):
            return None
        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            try:
                return open(path, "rb").read()
            except OSError as e:
                raise ValueError(f"etcd TLS file {path}: {e.strerror or e}") from None
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file), read(self.cert_file))


class _TlsClient(aetcd.Client):
    """aetcd's client on a TLS channel: aetcd 1.0 opens plaintext channels only, so this
    builds the secure channel and the same stubs aetcd's own connect builds (hence the
    upper bound on aetcd in pyproject)."""

    def __init__(self, *args, credentials: grpc.ChannelCredentials, **kwargs):
        super().__init__(*args, **kwargs)
        self._credentials = credentials
        self._connect_lock = asyncio.Lock()

    async def connect(self) -> None:
        async with self._connect_lock:
            if self._connected.is_set():
                return
            channel = rpc.secure_channel(f"{self._host}:{self._port}", self._credentials,
                                         options=self._options.items())
            metadata = None
            if self._username is not None:
                reply = await rpc.AuthStub(channel).Authenticate(
                    rpc.AuthenticateRequest(name=self._username, password=self._password), timeout=self._timeout)
                metadata = (("token", reply.token),)
            self.channel, self.metadata = channel, metadata
            self.kvstub, self.leasestub = rpc.KVStub(channel), rpc.LeaseStub(channel)
            self.clusterstub, self.maintenancestub = rpc.ClusterStub(channel), rpc.MaintenanceStub(channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(channel), timeout=self._timeout, metadata=metadata)
            self._connected.set()


class EtcdKV:
    """`KV` on etcd; same semantics as the embedded store, etcd's own limits."""

    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float = 5.0,
                 max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 security: EtcdSecurity | None = None):
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.security = security or EtcdSecurity()
        self._credentials = self.security.credentials()  # bad files fail here, not at first use
        self.endpoints = list(endpoints)
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self._timeout = timeout_s
        self._next = 0
        self._client: aetcd.Client | None = None
        self._watch_tasks: set[asyncio.Task] = set()
        self._closed = False

    # --- connection ----------------------------------------------------------------------

    async def _connected(self) -> aetcd.Client:
        if self._closed:
            raise CoordinatorError("the etcd coordinator client is closed")
        if self._client is None:
            host, port = self.endpoints[self._next % len(self.endpoints)]
            # Published before connecting so concurrent first calls share one channel.
            sec = self.security
            if self._credentials is not None:
                self._client = _TlsClient(host=host, port=port, timeout=self._timeout,
                                          username=sec.username, password=sec.password,
                                          options=dict(_CHANNEL_OPTIONS), credentials=self._credentials)
            else:
                self._client = aetcd.Client(host=host, port=port, timeout=self._timeout,
                                            username=sec.username, password=sec.password,
                                            options=dict(_CHANNEL_OPTIONS))
        client = self._client
        try:
            await self._bounded(client.connect())
        except (aetcd.ClientError, asyncio.TimeoutError, OSError) as e:
            raise await self._translate(e, client) from e
        return client

    async def _drop_client(self, client: aetcd.Client | None) -> None:
        """Forget a client that failed, unless another call already replaced it."""
        if client is None or client is not self._client:
            return
        failed: aetcd.Client = client
        self._client = None
        self._next += 1
        try:
            await self._bounded(failed.close())
        except Exception:  # noqa: BLE001 - the channel is already broken; nothing to keep
            log.debug("closing a broken etcd channel failed", exc_info=True)

    async def _bounded(self, awaitable):
        """Every call to etcd goes through here, for two reasons.

        A deadline: calls without a gRPC deadline of their own (connecting, the keepalive
        stream, closing) can otherwise wait forever after etcd is paused or restarted.

        Cancellation that is not ours: when one call drops a broken channel, gRPC cancels the
        other calls in flight on it, and they raise CancelledError in tasks nobody cancelled.
        Passed on as is, that silently ends whatever loop made the call (a lease keepalive, a
        WAL commit); it is an outage like any other, so it becomes CoordinatorUnavailable.
        """
        try:
            return await asyncio.wait_for(awaitable, self._timeout)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            raise CoordinatorUnavailable(f"etcd at {self._where()}: the call was cancelled "
                                         f"with its channel") from None

    def _where(self) -> str:
        host, port = self.endpoints[self._next % len(self.endpoints)]
        return f"{host}:{port}"

    async def _translate(self, e: BaseException, client: aetcd.Client | None
                         ) -> CoordinatorError:
        where = self._where()
        if isinstance(e, grpc.aio.AioRpcError):
            code, details = e.code(), e.details() or ""
            if code in _UNAVAILABLE:
                await self._drop_client(client)
                return CoordinatorUnavailable(f"etcd at {where} is unavailable: {details}")
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED or "too large" in details \
                    or "too many operations" in details:
                return RequestTooLarge(f"etcd refused the request: {details}")
            return CoordinatorError(f"etcd at {where}: {details} ({code.name})")
        if isinstance(e, (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError,
                          aetcd.WatchTimeoutError, asyncio.TimeoutError, OSError)):
            await self._drop_client(client)
            return CoordinatorUnavailable(f"etcd at {where} is unavailable: {e}")
        if isinstance(e, aetcd.ClientError):
            cause = e.__cause__
            if isinstance(cause, grpc.aio.AioRpcError):
                return await self._translate(cause, client)
            return CoordinatorError(f"etcd at {where}: {e}")
        raise e

    async def _kv(self, method: str, request):
        client = await self._connected()
        try:
            return await self._bounded(getattr(client.kvstub, method)(
                request, timeout=self._timeout, metadata=client.metadata))
        except (grpc.aio.AioRpcError, aetcd.ClientError, asyncio.TimeoutError, OSError) as e:
            raise await self._translate(e, client) from e

    async def _lease(self, method: str, request):
        client = await self._connected()
        try:
            return await self._bounded(getattr(client.leasestub, method)(
                request, timeout=self._timeout, metadata=client.metadata))
        except (grpc.aio.AioRpcError, aetcd.ClientError, asyncio.TimeoutError, OSError) as e:
            raise await self._translate(e, client) from e

    # --- KV ------------------------------------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, int] | None:
        resp = await self._kv("Range", rpc.RangeRequest(key=key.encode()))
        if not resp.kvs:
            return None
        return bytes(resp.kvs[0].value), resp.kvs[0].mod_revision

    async def range(self, prefix: str) -> list[tuple[str, bytes, int]]:
        resp = await self._kv("Range", rpc.RangeRequest(key=prefix.encode(),
                                                        range_end=_range_end(prefix)))
        return [(kv.key.decode(), bytes(kv.value), kv.mod_revision) for kv in resp.kvs]

    async def snapshot(self, prefixes: list[str], min_mod_revision: int = 0
                       ) -> tuple[int, list[tuple[str, bytes, int]]]:
        ops = [rpc.RequestOp(request_range=rpc.RangeRequest(
            key=p.encode(), range_end=_range_end(p), min_mod_revision=min_mod_revision))
            for p in prefixes]
        if len(ops) > self.max_txn_ops:
            raise RequestTooLarge(f"snapshot of {len(ops)} prefixes exceeds {self.max_txn_ops}")
        resp = await self._kv("Txn", rpc.TxnRequest(success=ops))
        out = [(kv.key.decode(), bytes(kv.value), kv.mod_revision)
               for r in resp.responses for kv in r.response_range.kvs]
        return resp.header.revision, out

    async def fingerprint(self, prefixes: list[str]) -> tuple:
        # The newest key by mod revision, keys only; `count` is the whole range's, whatever
        # the limit.
        ops = [rpc.RequestOp(request_range=rpc.RangeRequest(
            key=p.encode(), range_end=_range_end(p), limit=1, keys_only=True,
            sort_order=rpc.RangeRequest.DESCEND, sort_target=rpc.RangeRequest.MOD))
            for p in prefixes]
        resp = await self._kv("Txn", rpc.TxnRequest(success=ops))
        return tuple((r.response_range.kvs[0].mod_revision if r.response_range.kvs else 0,
                      r.response_range.count) for r in resp.responses)

    def local_revision(self) -> int | None:
        return None

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        check_txn([], [Put(key, value, lease)], [], self.max_txn_ops, self.max_request_bytes)
        resp = await self._kv("Put", rpc.PutRequest(key=key.encode(), value=bytes(value),
                                                    lease=lease or 0))
        return resp.header.revision

    async def delete(self, key: str) -> bool:
        resp = await self._kv("DeleteRange", rpc.DeleteRangeRequest(key=key.encode()))
        return resp.deleted > 0

    async def delete_prefix(self, prefix: str) -> int:
        resp = await self._kv("DeleteRange", rpc.DeleteRangeRequest(
            key=prefix.encode(), range_end=_range_end(prefix)))
        return resp.deleted

    @staticmethod
    def _compare(c: Compare) -> rpc.Compare:
        msg = rpc.Compare(key=c.key.encode(), target=_TARGETS[c.target], result=_RESULTS[c.op])
        if c.target == "value":
            msg.value = bytes(c.operand)
        elif c.target == "mod":
            msg.mod_revision = int(c.operand)
        else:
            msg.version = int(c.operand)
        return msg

    @staticmethod
    def _op(op: Op) -> rpc.RequestOp:
        if isinstance(op, Put):
            return rpc.RequestOp(request_put=rpc.PutRequest(
                key=op.key.encode(), value=bytes(op.value), lease=op.lease or 0))
        if isinstance(op, Delete):
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode()))
        if isinstance(op, DeletePrefix):
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(
                key=op.prefix.encode(), range_end=_range_end(op.prefix)))
        raise TypeError(f"not a transaction op: {op!r}")

    async def txn(self, compares: list[Compare], success: list[Op],
                  failure: Sequence[Op] = ()) -> bool:
        check_txn(compares, success, failure, self.max_txn_ops, self.max_request_bytes)
        resp = await self._kv("Txn", rpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(o) for o in success], failure=[self._op(o) for o in failure]))
        return bool(resp.succeeded)

    async def grant_lease(self, ttl_s: int) -> int:
        if ttl_s <= 0:
            raise ValueError(f"lease TTL must be positive, got {ttl_s}")
        resp = await self._lease("LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_s, ID=0))
        if resp.error:
            raise CoordinatorError(f"etcd refused a lease: {resp.error}")
        return resp.ID

    async def keepalive(self, lease: int) -> bool:
        client = await self._connected()
        try:
            reply = await self._bounded(client.refresh_lease(lease))
        except (grpc.aio.AioRpcError, aetcd.ClientError, asyncio.TimeoutError, OSError) as e:
            err = await self._translate(e, client)
            if "lease not found" in str(err):
                return False  # it expired (e.g. while etcd was down): the caller re-registers
            raise err from e
        return reply is not None and reply.TTL > 0

    async def revoke(self, lease: int) -> None:
        try:
            await self._lease("LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease))
        except CoordinatorError as e:
            if "lease not found" not in str(e):
                raise

    async def watch_prefix(self, prefix: str) -> Watch:
        client = await self._connected()
        try:
            inner = await client.watch(prefix.encode(), range_end=_range_end(prefix))
        except (grpc.aio.AioRpcError, aetcd.ClientError, asyncio.TimeoutError, OSError) as e:
            raise await self._translate(e, client) from e
        task: asyncio.Task | None = None

        async def stop() -> None:
            try:
                await inner.cancel()
            except Exception:  # noqa: BLE001 - the stream may already be gone
                log.debug("cancelling an etcd watch failed", exc_info=True)
            if task is not None:
                task.cancel()

        watch = Watch(stop)

        async def pump() -> None:
            try:
                async for ev in inner:
                    put = ev.kind == "PUT"
                    watch.push(Event("put" if put else "delete", ev.kv.key.decode(),
                                     bytes(ev.kv.value) if put else b"", ev.kv.mod_revision))
                watch.push(None)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - handed to the consumer, not swallowed
                try:
                    err: BaseException = await self._translate(e, client)
                except Exception as other:  # noqa: BLE001
                    err = other
                watch.push(err)

        task = asyncio.get_running_loop().create_task(pump(), name=f"etcd-watch {prefix}")
        self._watch_tasks.add(task)
        task.add_done_callback(self._watch_tasks.discard)
        return watch

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for t in list(self._watch_tasks):
            t.cancel()
        await asyncio.gather(*self._watch_tasks, return_exceptions=True)
        client, self._client = self._client, None
        if client is not None:
            await client.close()
