"""The embedded coordinator: the `KV` boundary over one SQLite file, for single-process use.

Layout of `<data_dir>/coordinator.sqlite3` (WAL journal, synchronous=FULL, so a transaction
that returned has been fsynced and survives kill -9):

    kv(key BLOB PRIMARY KEY, value BLOB, mod_rev, create_rev, version, lease)
    meta(name TEXT PRIMARY KEY, value INTEGER)   -- format, revision, next_lease

`meta.format` is this schema's version, FORMAT_VERSION when created. Opening reads it before
touching anything else (no journal switch, no CREATE) and refuses a version outside
OLDEST_READABLE_VERSION..FORMAT_VERSION, so a newer database is neither misread nor
altered. What the keys and values mean is versioned apart, in the keyspace
(`coordinator.store`).

Invariants: `meta.revision` is the global revision; every row's mod_rev <= revision; keys
are UTF-8 bytes so SQLite's memcmp order is etcd's key order. `<data_dir>/coordinator.lock`
is held with flock(LOCK_EX) for the life of the store, so a second process fails fast.

Leases live in memory and expire by the injected clock. A lease cannot outlive the process
that granted it (the lock guarantees that process is gone), so opening the store deletes
every leased key left by a previous run.

`EmbeddedReader` reads the database beside the process holding it (read-only, no lock),
for backups of a running gateway.

Writes run on one worker thread (the fsync stays off the event loop and writes are
serialized there); reads use a second connection on the caller's thread, which WAL mode lets
run beside a write and which sees every transaction that has returned.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from stratalog.coordinator.kv import (
    DEFAULT_MAX_REQUEST_BYTES, Compare, CoordinatorError, DataDirInUse,
    Delete, DeletePrefix, Event, Op, Put, UnsupportedFormat, Watch, check_txn, prefix_end,
    unsupported_version)

FORMAT_VERSION = 1  # written; readers take OLDEST_READABLE_VERSION..FORMAT_VERSION
OLDEST_READABLE_VERSION = 1
DB_FILE = "coordinator.sqlite3"
LOCK_FILE = "coordinator.lock"
# Operations one transaction may hold. etcd allows 128, so a WAL commit of a flush that
# holds more partitions is split into several fenced transactions there (coordinator.store);
# SQLite has no such bound, and one gateway leading thousands of partitions commits each
# flush in one transaction. Request bytes keep etcd's bound: every value stays one that an
# etcd cluster would take, should the installation move to one.
MAX_TXN_OPS = 1_000_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, mod_rev INTEGER NOT NULL,
    create_rev INTEGER NOT NULL, version INTEGER NOT NULL, lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_mod_rev ON kv(mod_rev);
CREATE INDEX IF NOT EXISTS kv_lease ON kv(lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


def _bounds(prefix: str) -> tuple[str, tuple]:
    start = prefix.encode()
    end = prefix_end(start)
    if end is None:
        return "key >= ?", (start,)
    return "key >= ? AND key < ?", (start, end)


def _holds(actual: bytes | int, op: str, operand: bytes | int) -> bool:
    if op == "==":
        return actual == operand
    if op == "!=":
        return actual != operand
    if op == "<":
        return actual < operand  # type: ignore[operator]
    if op == ">":
        return actual > operand  # type: ignore[operator]
    raise ValueError(f"unknown compare operator {op!r}")


class EmbeddedKV:
    """SQLite-backed `KV` (see the module docstring for layout and invariants)."""

    def __init__(self, data_dir: Path, clock: Callable[[], float] = time.monotonic,
                 max_txn_ops: int = MAX_TXN_OPS,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES):
        self.data_dir = Path(data_dir)
        self.max_txn_ops = max_txn_ops
        self.max_request_bytes = max_request_bytes
        self._clock = clock
        self._leases: dict[int, tuple[int, float]] = {}  # id -> (ttl, expires at)
        self._watches: list[tuple[str, Watch]] = []
        self._closed = False
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DataDirInUse(
                f"data directory {self.data_dir} is in use by another stratalog process") from None
        conns: list[sqlite3.Connection] = []
        try:
            path = self.data_dir / DB_FILE
            self._writer = self._connect(path)
            conns.append(self._writer)
            self._init_schema(path)
            self._reader = self._connect(path)
            conns.append(self._reader)
            self._reader.execute("PRAGMA query_only=1")
            self._snapshot_reader = self._connect(path)
            conns.append(self._snapshot_reader)
            self._snapshot_reader.execute("PRAGMA query_only=1")
        except BaseException:
            for c in conns:
                c.close()
            os.close(self._lock_fd)
            raise
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stratalog-kv")
        self._snapshots = _snapshot_thread()
        self._drop_stale_leased_keys()

    # --- setup --------------------------------------------------------------------------

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def _init_schema(self, path: Path) -> None:
        w = self._writer
        try:
            self._check_format(path)
            mode = w.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            w.execute("PRAGMA synchronous=FULL")
            w.executescript(_SCHEMA)
            row = w.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        except sqlite3.DatabaseError as e:
            raise CoordinatorError(
                f"{path} is not a usable stratalog coordinator database: {e}") from e
        if mode.lower() != "wal":
            raise CoordinatorError(f"{path}: cannot switch the journal to WAL mode ({mode})")
        if row is None:
            w.execute("BEGIN IMMEDIATE")
            w.executemany("INSERT OR IGNORE INTO meta(name, value) VALUES (?, ?)",
                          [("format", FORMAT_VERSION), ("revision", 1), ("next_lease", 1)])
            w.execute("COMMIT")
        missing = {"revision", "next_lease"} - {
            r[0] for r in w.execute("SELECT name FROM meta")}
        if missing:
            raise CoordinatorError(f"{path} is damaged: meta rows {sorted(missing)} are missing")

    def _check_format(self, path: Path) -> None:
        """Refuse a database whose schema version this code does not read, before any change."""
        w = self._writer
        if w.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is None:
            return  # a new database
        row = w.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        if row is None:
            return  # created, then interrupted before its meta rows: finished by _init_schema
        if not (isinstance(row[0], int) and OLDEST_READABLE_VERSION <= row[0] <= FORMAT_VERSION):
            raise UnsupportedFormat(unsupported_version(
                f"embedded coordinator database {path}", row[0], OLDEST_READABLE_VERSION,
                FORMAT_VERSION))

    def _drop_stale_leased_keys(self) -> None:
        def drop() -> list[Event]:
            return self._in_txn(lambda rev: self._delete_where("lease != 0", (), rev))
        self._dispatch(self._executor.submit(drop).result())

    # --- the write side (worker thread only) -------------------------------------------

    def _revision(self, conn: sqlite3.Connection) -> int:
        return conn.execute("SELECT value FROM meta WHERE name='revision'").fetchone()[0]

    def _in_txn(self, body: Callable[[int], list[Event]]) -> list[Event]:
        """Run body(new_revision) in one write transaction; the revision is bumped only if
        body reports a change."""
        w = self._writer
        w.execute("BEGIN IMMEDIATE")
        try:
            rev = self._revision(w) + 1
            events = body(rev)
            if events:
                w.execute("UPDATE meta SET value=? WHERE name='revision'", (rev,))
            w.execute("COMMIT")
        except BaseException:
            w.execute("ROLLBACK")
            raise
        return events

    def _delete_where(self, where: str, args: tuple, rev: int) -> list[Event]:
        w = self._writer
        keys = [r[0] for r in w.execute(f"SELECT key FROM kv WHERE {where} ORDER BY key", args)]
        if keys:
            w.execute(f"DELETE FROM kv WHERE {where}", args)
        return [Event("delete", k.decode(), b"", rev) for k in keys]

    def _put_row(self, key: str, value: bytes, lease: int | None, rev: int) -> Event:
        if lease and lease not in self._leases:
            raise CoordinatorError(f"lease {lease} not found (expired or revoked)")
        k = key.encode()
        w = self._writer
        old = w.execute("SELECT create_rev, version FROM kv WHERE key=?", (k,)).fetchone()
        create_rev, version = (old[0], old[1] + 1) if old else (rev, 1)
        w.execute("INSERT OR REPLACE INTO kv(key, value, mod_rev, create_rev, version, lease) "
                  "VALUES (?, ?, ?, ?, ?, ?)", (k, bytes(value), rev, create_rev, version,
                                                lease or 0))
        return Event("put", key, bytes(value), rev)

    def _apply(self, ops: Sequence[Op], rev: int) -> list[Event]:
        events: list[Event] = []
        for op in ops:
            if isinstance(op, Put):
                events.append(self._put_row(op.key, op.value, op.lease, rev))
            elif isinstance(op, Delete):
                events += self._delete_where("key = ?", (op.key.encode(),), rev)
            elif isinstance(op, DeletePrefix):
                where, args = _bounds(op.prefix)
                events += self._delete_where(where, args, rev)
            else:
                raise TypeError(f"not a transaction op: {op!r}")
        return events

    def _holds(self, c: Compare) -> bool:
        row = self._writer.execute("SELECT value, mod_rev, version FROM kv WHERE key=?",
                                   (c.key.encode(),)).fetchone()
        if c.target == "value":
            # etcd: a value compare on a missing key fails whatever the operator.
            operand = bytes(c.operand)
            return row is not None and _holds(bytes(row[0]), c.op, operand)
        if c.target == "mod":
            return _holds(row[1] if row else 0, c.op, int(c.operand))
        if c.target == "version":
            return _holds(row[2] if row else 0, c.op, int(c.operand))
        raise ValueError(f"unknown compare target {c.target!r}")

    # --- plumbing ------------------------------------------------------------------------

    async def _write(self, fn: Callable[[], tuple[object, list[Event]]]) -> object:
        self._check_open()
        result, events = await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        self._dispatch(events)
        return result

    def _dispatch(self, events: list[Event]) -> None:
        for ev in events:
            for prefix, w in self._watches:
                if ev.key.startswith(prefix):
                    w.push(ev)

    def _check_open(self) -> None:
        if self._closed:
            raise CoordinatorError("the embedded coordinator is closed")

    async def _expire(self) -> None:
        self._check_open()
        now = self._clock()
        due = [lid for lid, (_, at) in self._leases.items() if at <= now]
        if due:
            await self._drop_leases(due)

    async def _drop_leases(self, ids: list[int]) -> None:
        for lid in ids:
            self._leases.pop(lid, None)
        marks = ",".join("?" * len(ids))

        def run() -> tuple[None, list[Event]]:
            return None, self._in_txn(lambda rev: self._delete_where(
                f"lease IN ({marks})", tuple(ids), rev))
        await self._write(run)

    # --- KV ------------------------------------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, int] | None:
        await self._expire()
        row = self._reader.execute("SELECT value, mod_rev FROM kv WHERE key=?",
                                   (key.encode(),)).fetchone()
        return (bytes(row[0]), row[1]) if row else None

    async def range(self, prefix: str) -> list[tuple[str, bytes, int]]:
        await self._expire()
        where, args = _bounds(prefix)
        return [(k.decode(), bytes(v), m) for k, v, m in self._reader.execute(
            f"SELECT key, value, mod_rev FROM kv WHERE {where} ORDER BY key", args)]

    async def snapshot(self, prefixes: list[str], min_mod_revision: int = 0
                       ) -> tuple[int, list[tuple[str, bytes, int]]]:
        # On a connection and thread of its own: a full read (the log index reloads after
        # every deletion) is every WAL entry of the last minute, hundreds of milliseconds
        # that would stop the event loop; SQLite lets the gateway's thread go meanwhile.
        await self._expire()
        return await asyncio.get_running_loop().run_in_executor(
            self._snapshots, self._read_snapshot, prefixes, min_mod_revision)

    def _read_snapshot(self, prefixes: list[str], min_mod_revision: int
                       ) -> tuple[int, list[tuple[str, bytes, int]]]:
        r = self._snapshot_reader
        r.execute("BEGIN")
        try:
            rev = self._revision(r)
            out: list[tuple[str, bytes, int]] = []
            # What changed since a revision is a few rows among many: found through the
            # mod_rev index, not by reading every row under the prefixes (the planner's
            # choice without statistics), which a gateway asks for every tick.
            source = "kv INDEXED BY kv_mod_rev" if min_mod_revision > 0 else "kv"
            for prefix in prefixes:
                where, args = _bounds(prefix)
                out += [(k.decode(), bytes(v), m) for k, v, m in r.execute(
                    f"SELECT key, value, mod_rev FROM {source} WHERE {where} AND mod_rev >= ? "
                    "ORDER BY key", args + (min_mod_revision,))]
        finally:
            r.execute("COMMIT")
        return rev, out

    async def fingerprint(self, prefixes: list[str]) -> tuple:
        await self._expire()
        out = []
        for prefix in prefixes:
            where, args = _bounds(prefix)
            out.append(tuple(self._reader.execute(
                f"SELECT coalesce(max(mod_rev), 0), count(*) FROM kv WHERE {where}", args).fetchone()))
        return tuple(out)

    def local_revision(self) -> int | None:
        if self._closed:
            return None
        now = self._clock()
        if any(at <= now for _, at in self._leases.values()):
            return None  # an expiry is due: make the caller go through a real read
        return self._revision(self._reader)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        await self._expire()
        check_txn([], [Put(key, value, lease)], [], self.max_txn_ops, self.max_request_bytes)

        def run() -> tuple[int, list[Event]]:
            events = self._in_txn(lambda rev: [self._put_row(key, value, lease, rev)])
            return events[0].mod_revision, events
        return await self._write(run)  # type: ignore[return-value]

    async def delete(self, key: str) -> bool:
        await self._expire()

        def run() -> tuple[bool, list[Event]]:
            events = self._in_txn(lambda rev: self._delete_where("key = ?", (key.encode(),), rev))
            return bool(events), events
        return await self._write(run)  # type: ignore[return-value]

    async def delete_prefix(self, prefix: str) -> int:
        await self._expire()
        where, args = _bounds(prefix)

        def run() -> tuple[int, list[Event]]:
            events = self._in_txn(lambda rev: self._delete_where(where, args, rev))
            return len(events), events
        return await self._write(run)  # type: ignore[return-value]

    async def txn(self, compares: list[Compare], success: list[Op],
                  failure: Sequence[Op] = ()) -> bool:
        await self._expire()
        check_txn(compares, success, failure, self.max_txn_ops, self.max_request_bytes)
        outcome: list[bool] = []

        def body(rev: int) -> list[Event]:
            ok = all(self._holds(c) for c in compares)
            outcome.append(ok)
            return self._apply(success if ok else failure, rev)

        def run() -> tuple[bool, list[Event]]:
            events = self._in_txn(body)
            return outcome[-1], events
        return await self._write(run)  # type: ignore[return-value]

    async def grant_lease(self, ttl_s: int) -> int:
        await self._expire()
        if ttl_s <= 0:
            raise ValueError(f"lease TTL must be positive, got {ttl_s}")

        def run() -> tuple[int, list[Event]]:
            w = self._writer
            w.execute("BEGIN IMMEDIATE")
            try:
                lid = w.execute("SELECT value FROM meta WHERE name='next_lease'").fetchone()[0]
                w.execute("UPDATE meta SET value=? WHERE name='next_lease'", (lid + 1,))
                w.execute("COMMIT")
            except BaseException:
                w.execute("ROLLBACK")
                raise
            return lid, []
        lid = await self._write(run)
        self._leases[lid] = (ttl_s, self._clock() + ttl_s)  # type: ignore[index]
        return lid  # type: ignore[return-value]

    async def keepalive(self, lease: int) -> bool:
        await self._expire()
        held = self._leases.get(lease)
        if held is None:
            return False
        self._leases[lease] = (held[0], self._clock() + held[0])
        return True

    async def revoke(self, lease: int) -> None:
        await self._expire()
        if lease in self._leases:
            await self._drop_leases([lease])

    async def watch_prefix(self, prefix: str) -> Watch:
        self._check_open()
        entry: tuple[str, Watch]

        async def forget() -> None:
            if entry in self._watches:
                self._watches.remove(entry)
        entry = (prefix, Watch(forget))
        self._watches.append(entry)
        return entry[1]

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _, w in self._watches:
            w.push(None)
        self._watches.clear()
        self._executor.shutdown(wait=True)
        self._snapshots.shutdown(wait=True)
        self._close_connections()
        self._writer.close()
        os.close(self._lock_fd)  # closing the descriptor releases the flock

    def _close_connections(self) -> None:
        """The read connections (the writer, where there is one, is closed apart)."""
        self._reader.close()
        self._snapshot_reader.close()


class EmbeddedReader(EmbeddedKV):
    """A read-only view of an embedded coordinator, usable while a gateway holds it.

    It takes no lock and opens one read-only connection: SQLite's WAL mode lets a reader in
    another process see every transaction committed before its read began, beside the
    writer, so `snapshot` is one consistent revision even while the gateway writes (what
    `stratalog coordinator backup` reads). It has no leases and refuses every write."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.max_txn_ops = MAX_TXN_OPS
        self.max_request_bytes = DEFAULT_MAX_REQUEST_BYTES
        self._clock = time.monotonic
        self._leases = {}
        self._watches = []
        self._closed = False
        path = self.data_dir / DB_FILE
        if not path.is_file():
            raise CoordinatorError(f"no embedded coordinator database at {path}")
        self._reader, self._snapshot_reader = (
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                            check_same_thread=False) for _ in range(2))
        self._writer = self._reader  # _check_format reads through it; nothing writes here
        try:
            for conn in (self._reader, self._snapshot_reader):
                conn.execute("PRAGMA busy_timeout=5000")
            self._check_format(path)
            if self._reader.execute("SELECT value FROM meta WHERE name='revision'").fetchone() is None:
                raise CoordinatorError(f"{path} is damaged: its meta row 'revision' is missing")
        except sqlite3.DatabaseError as e:
            self._close_connections()
            raise CoordinatorError(f"{path} is not a usable stratalog coordinator database: {e}") from e
        except BaseException:
            self._close_connections()
            raise
        self._snapshots = _snapshot_thread()

    async def _write(self, fn):
        raise CoordinatorError(f"the embedded coordinator of {self.data_dir} is open read-only here")

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._snapshots.shutdown(wait=True)
            self._close_connections()


def _snapshot_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="stratalog-kv-snapshot")
