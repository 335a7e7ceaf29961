"""The coordinator's key-value boundary: what the cluster model needs from etcd or from the
embedded store, and nothing more.

Semantics follow etcd's v3 API so both backends behave alike:

- Keys are strings (compared as UTF-8 bytes), values bytes.
- One global revision counts committed writes. A write (or a transaction with at least one
  effective change) bumps it once; every key it touched gets that revision as its mod
  revision. A delete that removes nothing changes nothing.
- A transaction evaluates every compare against the state before it, then applies either
  its success or its failure ops, atomically. A value compare on an absent key is false
  whatever the operator; version/mod compares see an absent key as 0.
- Within one transaction no key may be put twice nor put and deleted (etcd refuses it).
- Limits: at most `max_txn_ops` compares, success ops and failure ops each, and at most
  `max_request_bytes` of keys and values in one request.
- A key put with a lease is deleted when the lease expires or is revoked.
"""

from __future__ import annotations

from dataclasses import dataclass
import asyncio
from typing import Awaitable, Callable, Literal, Protocol, Sequence, Union

DEFAULT_MAX_TXN_OPS = 128
DEFAULT_MAX_REQUEST_BYTES = 1536 * 1024


class CoordinatorError(Exception):
    """The coordinator refused or failed a request."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordinator cannot be reached now; the same call may work later."""


class RequestTooLarge(CoordinatorError):
    """A request exceeds the backend's transaction or size limits."""


class DataDirInUse(CoordinatorError):
    """Another process holds the embedded coordinator's data directory."""


class UnsupportedFormat(CoordinatorError):
    """Stored metadata in a format version this Stratalog cannot read (written by a newer
    one): refused before anything is read or written, so it is never misread."""


def unsupported_version(what: str, found: object, oldest: int, newest: int) -> str:
    """The wording of every refusal of a format version, naming both versions (the same
    as tiering's, which coordinator may not import)."""
    reads = f"version {newest}" if oldest == newest else f"versions {oldest}-{newest}"
    advice = "upgrade the gateway" if isinstance(found, int) and found > newest else \
        "it was not written by a Stratalog this one can read"
    return f"{what} has format version {found}; this Stratalog reads {reads}: {advice}"


CompareTarget = Literal["value", "mod", "version"]
CompareOp = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True)
class Compare:
    """One transaction guard: `target(key) op operand`."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: bytes | int


def value_is(key: str, value: bytes) -> Compare:
    return Compare(key, "value", "==", value)


def mod_is(key: str, revision: int) -> Compare:
    """The key's mod revision equals `revision` (0: the key is absent)."""
    return Compare(key, "mod", "==", revision)


def absent(key: str) -> Compare:
    return Compare(key, "version", "==", 0)


def exists(key: str) -> Compare:
    return Compare(key, "version", ">", 0)


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int | None = None


@dataclass(frozen=True)
class Delete:
    key: str


@dataclass(frozen=True)
class DeletePrefix:
    prefix: str


Op = Union[Put, Delete, DeletePrefix]


@dataclass(frozen=True)
class Event:
    """One change seen by a watch; `value` is empty for deletes."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    mod_revision: int


class Watch:
    """Change events under a prefix, in revision order, from the moment the watch was made.

    Iterate with `async for`; an error of the backend (e.g. CoordinatorUnavailable) ends the
    iteration by being raised. `close()` ends it quietly.
    """

    def __init__(self, on_close: Callable[[], Awaitable[None]] | None = None):
        self._queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False

    def push(self, item: Event | BaseException | None) -> None:
        """Backend side: deliver an event, an error, or None for the end."""
        if not self._closed:
            self._queue.put_nowait(item)

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._closed = True
            raise item
        return item

    async def close(self) -> None:
        if self._closed:
            return
        self._queue.put_nowait(None)
        self._closed = True
        if self._on_close is not None:
            await self._on_close()


class KV(Protocol):
    """A revisioned key-value store with transactions, leases and watches."""

    max_txn_ops: int
    max_request_bytes: int

    async def get(self, key: str) -> tuple[bytes, int] | None:
        """Value and mod revision of one key, None if absent."""

    async def range(self, prefix: str) -> list[tuple[str, bytes, int]]:
        """(key, value, mod revision) of every key starting with prefix, sorted by key."""

    async def snapshot(self, prefixes: list[str], min_mod_revision: int = 0
                       ) -> tuple[int, list[tuple[str, bytes, int]]]:
        """Current revision and the keys under several prefixes modified at or after
        min_mod_revision, all read at that one revision."""

    async def fingerprint(self, prefixes: list[str]) -> tuple:
        """Per prefix, (greatest mod revision, number of keys) under it: it changes whenever
        anything under the prefix is put or deleted, and costs no values to read. Equal
        fingerprints at two times mean equal contents (a key written in between would carry
        a greater revision, so the later keys are a subset of the earlier ones)."""

    def local_revision(self) -> int | None:
        """The current revision if known without I/O (single-process backends), else None."""

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Store a value; returns the new revision."""

    async def delete(self, key: str) -> bool:
        """Remove one key; True if it existed."""

    async def delete_prefix(self, prefix: str) -> int:
        """Remove every key starting with prefix; returns how many."""

    async def txn(self, compares: list[Compare], success: list[Op],
                  failure: Sequence[Op] = ()) -> bool:
        """Atomically apply success ops if every compare holds, else failure ops; True on
        success."""

    async def grant_lease(self, ttl_s: int) -> int:
        """Create a lease of ttl_s seconds; returns its id."""

    async def keepalive(self, lease: int) -> bool:
        """Restart a lease's TTL; False if it already expired or was revoked."""

    async def revoke(self, lease: int) -> None:
        """End a lease now, deleting its keys."""

    async def watch_prefix(self, prefix: str) -> Watch:
        """Start watching changes under prefix; events after this call returns are seen."""

    async def close(self) -> None:
        """Release connections, files and locks."""


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with prefix (None: no bound)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


def request_bytes(compares: Sequence[Compare], ops: Sequence[Op]) -> int:
    """Approximate wire size of a transaction: keys and values plus a little per entry."""
    n = 0
    for c in compares:
        n += len(c.key) + (len(c.operand) if isinstance(c.operand, bytes) else 8) + 16
    for op in ops:
        if isinstance(op, Put):
            n += len(op.key.encode()) + len(op.value) + 16
        elif isinstance(op, Delete):
            n += len(op.key.encode()) + 8
        else:
            n += 2 * len(op.prefix.encode()) + 8
    return n


def check_txn(compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op],
              max_ops: int, max_bytes: int) -> None:
    """Refuse what etcd would refuse: too many ops, too many bytes, or a key written twice."""
    for name, items in (("compares", compares), ("success ops", success),
                        ("failure ops", failure)):
        if len(items) > max_ops:
            raise RequestTooLarge(f"transaction has {len(items)} {name}; the limit is {max_ops}")
    size = request_bytes(compares, list(success) + list(failure))
    if size > max_bytes:
        raise RequestTooLarge(f"transaction is about {size} bytes; the limit is {max_bytes}")
    for ops in (success, failure):
        puts: set[str] = set()
        for op in ops:
            if isinstance(op, Put):
                if op.key in puts:
                    raise ValueError(f"key {op.key!r} is put twice in one transaction")
                puts.add(op.key)
        for op in ops:
            if isinstance(op, Delete) and op.key in puts:
                raise ValueError(f"key {op.key!r} is both put and deleted in one transaction")
            if isinstance(op, DeletePrefix) and any(k.startswith(op.prefix) for k in puts):
                raise ValueError(f"prefix {op.prefix!r} is deleted while one of its keys is "
                                 "put in the same transaction")
