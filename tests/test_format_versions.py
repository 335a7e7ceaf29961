"""Format versions: every persistent format Stratalog owns carries one; today's code reads
what it claims (data without a version is 0.1.0's, version 1) and refuses a newer version
with one message naming both, before reading or changing anything, so it never misreads.

Each test writes a newer version by hand. Kafka's own formats in segments are versioned by
Kafka (the batch magic byte: test_batch.py refuses magic other than 2). What releases
really wrote is opened in test_upgrade.py; docs/formats.md lists the formats.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stratalog.coordinator import open_coordinator
from stratalog.coordinator.embedded import DB_FILE, EmbeddedKV
from stratalog.coordinator.etcd import EtcdKV
from stratalog.coordinator.kv import UnsupportedFormat as CoordinatorFormat
from stratalog.coordinator.model import PartitionState, WalObject, WalRange
from stratalog.coordinator.store import KEYSPACE_VERSION, KVClusterStore
from stratalog.gateway import datadir
from stratalog.engine.partition import PartitionLog
from stratalog.engine.replica import ReplicaView
from stratalog.tiering import manifest, wal
from stratalog.tiering.batch import build_batch
from stratalog.tiering.errors import CorruptObject, UnsupportedFormat
from stratalog.tiering.objectstore import open_store
from stratalog.tiering.remote import RemoteCache

from conftest import ROOT
from etcd_fixture import etcd_server  # noqa: F401 - fixture

TID = uuid.UUID("0b6f7c1e-2d3a-4e55-9a77-5b1c2d3e4f60")
NEWER = "has format version 2; this Stratalog reads version 1: upgrade the gateway"


def run(coro):
    return asyncio.run(coro)


# ---- WAL objects ------------------------------------------------------------------------

def _wal_object() -> bytes:
    b = wal.WalBuilder()
    b.add(TID, 0, 0, 1, 1001, build_batch([(b"k", b"v"), (None, b"w")], timestamps=[1000, 1001]))
    return b.build()[0]


def _with_version(data: bytes, header: int | None, trailer: int | None) -> bytes:
    out = bytearray(data)
    if header is not None:
        out[4:6] = header.to_bytes(2, "big")
    if trailer is not None:
        at = len(out) - wal.TRAILER_SIZE + 16
        out[at:at + 2] = trailer.to_bytes(2, "big")
    return bytes(out)


def test_wal_object_versions():
    data = _wal_object()
    assert len(wal.read_wal(data)) == 1  # version 1, as 0.1.0 wrote it
    key = "wal/1/00000000000000000042.wal"
    for header, trailer in ((2, 2), (2, None), (None, 2)):
        with pytest.raises(UnsupportedFormat) as e:
            wal.read_wal(_with_version(data, header, trailer), key)
        assert str(e.value) == f"WAL object {key} {NEWER}"
    newer_tail = _with_version(data, None, 2)[-wal.TRAILER_SIZE:]
    for read in (wal.footer_size, wal.read_footer, wal.object_size):
        with pytest.raises(UnsupportedFormat, match=NEWER):
            read(newer_tail)
    with pytest.raises(UnsupportedFormat, match="format version 0; this Stratalog reads version 1: "
                                                "it was not written by a Stratalog"):
        wal.read_wal(_with_version(data, 0, 0))
    # Still refused as corruption by whoever only knows CorruptObject.
    assert issubclass(UnsupportedFormat, CorruptObject)


def test_wal_commit_confirmations_are_a_range_older_readers_pass_over():
    """An object with confirmations is still a version 1 object (readers of WAL ranges read
    only the ranges coordinator entries name); the confirmation range's own newer version
    is refused, naming the object."""
    builder = wal.WalBuilder()
    wal.add_confirmations(builder, wal.SequenceSet([(1, 3)]))
    data, _ = builder.build()
    assert data[4:6] == b"\x00\x01"
    ((info, body),) = wal.read_wal(data)
    assert info.topic_id == wal.CONFIRMATION_TOPIC_ID
    newer = bytearray(body)
    newer[4:6] = (2).to_bytes(2, "big")
    key = "wal/1/00000000000000000042.wal"
    with pytest.raises(UnsupportedFormat) as e:
        wal.decode_confirmations(bytes(newer), key)
    assert str(e.value) == f"WAL confirmation range in {key} {NEWER}"


def _store_with_topic(tmp_path: Path):
    """An embedded coordinator holding one topic of one partition; (store, topic id)."""
    store = open_coordinator(None, tmp_path / "coord")
    info = run(store.create_topic("t", 1, 1, {}, {0: PartitionState(1, 0, (1,), (1,))}))
    return store, info.topic_id


def _range(topic_id) -> dict:
    return {"topic_id": str(topic_id), "partition": 0, "base_offset": 0, "last_offset": 1,
            "position": 8, "length": 100, "max_timestamp": 1001}


def test_wal_entries_carry_the_object_version(tmp_path):
    store, tid = _store_with_topic(tmp_path)
    r = WalRange(tid, 0, 0, 1, 8, 100, 1001, wal.FORMAT_VERSION)
    run(store.commit_wal(WalObject(1, 3, "wal/1/3.wal", (r,), wal.FORMAT_VERSION), {(tid, 0): 0}))
    # 0.1.0 wrote entries without "format": they are version 1.
    run(store.kv.put(store.prefix + "wal/1/00000000000000000002",
                     json.dumps({"key": "wal/1/2.wal", "ranges": [_range(tid)]}).encode()))
    value, _ = run(store.kv.get(store.prefix + "wal/1/00000000000000000003"))
    assert json.loads(value)["format"] == wal.FORMAT_VERSION
    assert {o.key: o.format_version for o in run(store.wal_objects())} == \
        {"wal/1/2.wal": 1, "wal/1/3.wal": wal.FORMAT_VERSION}
    assert {k: r.format_version for k, r in run(store.wal_ranges(tid, 0, 0))} == \
        {"wal/1/2.wal": 1, "wal/1/3.wal": wal.FORMAT_VERSION}
    run(store.close())


def test_wal_entry_of_a_newer_version_is_refused_before_its_range_is_read(tmp_path):
    store, tid = _store_with_topic(tmp_path)
    key = "wal/1/00000000000000000007.wal"
    run(store.kv.put(store.prefix + "wal/1/00000000000000000007", json.dumps(
        {"key": key, "format": 2, "ranges": [_range(tid)]}).encode()))
    # The object does not even exist: the refusal must come before any GET.
    objects = open_store((tmp_path / "objects").as_uri())
    with pytest.raises(UnsupportedFormat) as e:
        run(PartitionLog.recover("t", tid, 0, 0, tmp_path / "logs", store, objects,
                                 index_interval_bytes=4096, now_ms=0))
    assert str(e.value) == f"WAL object {key} {NEWER}"
    view = ReplicaView("t", tid, 0)
    with pytest.raises(UnsupportedFormat, match=f"WAL object {key} {NEWER}"):
        run(view.catch_up(store, RemoteCache(objects, tmp_path / "cache", max_bytes=0), 0.0))
    run(store.close())


# ---- manifests --------------------------------------------------------------------------

def test_manifest_versions():
    data = manifest.write_manifest("t", TID, 0, 5, 0, [])
    assert manifest.read_manifest(data).version == 5
    field = b"stratalog.manifest.format\x02"  # Avro map entry: key, then a 1-byte string
    # Without transaction fields the manifest stays format 1, which 0.1.0's readers read.
    assert data.count(field + b"1") == 1
    newer = data.replace(field + b"1", field + b"3")
    with pytest.raises(UnsupportedFormat) as e:
        manifest.read_manifest(newer, "manifests/t-x/0/00000000000000000005.avro")
    assert str(e.value) == ("manifest manifests/t-x/0/00000000000000000005.avro has format version 3; "
                            "this Stratalog reads versions 1-2: upgrade the gateway")
    with pytest.raises(CorruptObject, match="no readable stratalog.manifest.format"):
        manifest.read_manifest(data.replace(field + b"1", field + b"x"))
    # With them it is format 2, read back whole.
    seg = manifest.SegmentRecord(0, 9, "k", 10, 1, 2, 0, aborted_txns=1, open_txn_offset=5)
    data = manifest.write_manifest("t", TID, 0, 6, 0, [seg])
    assert data.count(field + b"2") == 1
    assert manifest.read_manifest(data).segments == [seg]


# ---- the embedded database --------------------------------------------------------------

def _files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir()) if p.is_file()}


def test_embedded_database_of_a_newer_version_is_refused_untouched(tmp_path):
    run(EmbeddedKV(tmp_path).close())
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute("UPDATE meta SET value=2 WHERE name='format'")
        db.execute("ALTER TABLE kv RENAME TO kv2")  # as a newer schema might: no table kv
    db.close()
    before = _files(tmp_path)
    with pytest.raises(CoordinatorFormat) as e:
        EmbeddedKV(tmp_path)
    assert str(e.value) == f"embedded coordinator database {tmp_path / DB_FILE} {NEWER}"
    assert _files(tmp_path) == before
    # The refusal let go of the directory's lock: put back, the version opens again.
    with sqlite3.connect(tmp_path / DB_FILE) as db:
        db.execute("UPDATE meta SET value=1 WHERE name='format'")
        db.execute("ALTER TABLE kv2 RENAME TO kv")
    db.close()
    run(EmbeddedKV(tmp_path).close())


# ---- the coordinator keyspace (both backends) -------------------------------------------

@pytest.fixture(params=["embedded", "etcd"])
def kv_factory(request, tmp_path):
    if request.param == "embedded":
        return lambda: EmbeddedKV(tmp_path / "coord")
    server = request.getfixturevalue("etcd_server")
    return lambda: EtcdKV([server.endpoint])


def test_keyspace_versions(kv_factory):
    cluster = f"v{uuid.uuid4().hex[:10]}"

    async def go():
        store = KVClusterStore(kv_factory(), cluster)
        key = store.prefix + "keyspace_version"
        try:
            # As 0.1.0 left a keyspace: data, no version key. Read as 1, marked only on request.
            await store.kv.put(store.prefix + "cluster_id", b'"c"')
            assert await store.check_keyspace(mark=False) == 1
            assert await store.kv.get(key) is None
            assert await store.check_keyspace() == KEYSPACE_VERSION
            assert (await store.kv.get(key))[0] == str(KEYSPACE_VERSION).encode()
            assert await store.check_keyspace() == KEYSPACE_VERSION
            await store.kv.put(key, b"2")
            for mark in (True, False):
                with pytest.raises(CoordinatorFormat) as e:
                    await store.check_keyspace(mark=mark)
                assert str(e.value) == f"coordinator keyspace /stratalog/{cluster}/ {NEWER}"
            assert (await store.kv.get(key))[0] == b"2"
        finally:
            await store.kv.delete_prefix(store.prefix)
            await store.close()
    run(go())


# ---- coordinator backups ----------------------------------------------------------------

def test_coordinator_backup_versions(tmp_path):
    from dataclasses import replace

    from stratalog.coordinator import backup
    from stratalog.engine.restore import restore

    b = backup.Backup("default", "c", KEYSPACE_VERSION, 5, 0, [("cluster_id", b'"c"')])
    data = backup.encode(b)
    assert backup.decode(data) == b
    with pytest.raises(CoordinatorFormat) as e:
        backup.decode(data.replace(b"BACKUP 1\n", b"BACKUP 2\n", 1), "f.backup")
    assert str(e.value) == f"coordinator backup f.backup {NEWER}"
    # A backup of a newer keyspace is refused before the target is touched.
    target = open_coordinator(None, tmp_path / "target")
    objects = open_store((tmp_path / "objects").as_uri())
    try:
        with pytest.raises(CoordinatorFormat) as e:
            run(restore(replace(b, keyspace_version=KEYSPACE_VERSION + 1), target, objects, tmp_path / "scratch"))
        assert str(e.value) == f"the backup's coordinator keyspace {NEWER}"
        assert run(target.kv.range(target.prefix)) == []
    finally:
        run(target.close())
        run(objects.close())


# ---- the data directory -----------------------------------------------------------------

def test_data_directory_versions(tmp_path):
    assert datadir.check(tmp_path) == 1  # no marker: 0.1.0
    datadir.mark(tmp_path)
    assert (tmp_path / datadir.MARKER).read_text() == f"{datadir.FORMAT_VERSION}\n"
    assert datadir.check(tmp_path) == datadir.FORMAT_VERSION
    (tmp_path / datadir.MARKER).write_text("2\n")
    with pytest.raises(datadir.UnsupportedDataDir) as e:
        datadir.check(tmp_path)
    assert str(e.value) == f"data directory {tmp_path} {NEWER}"
    (tmp_path / datadir.MARKER).write_text("two\n")
    with pytest.raises(datadir.UnsupportedDataDir, match="does not hold a format version"):
        datadir.check(tmp_path)


@pytest.mark.parametrize("command", [["segments", "ls"], ["users", "list"], ["coordinator", "backup", "-"],
                                     ["compact", "--topic", "t"]], ids=lambda c: c[0])
def test_commands_on_a_data_directory_refuse_a_newer_one_in_one_line(tmp_path, capsys, command):
    from stratalog.infra.cli import main

    d = tmp_path / "data"
    (d / "objects").mkdir(parents=True)
    (d / datadir.MARKER).write_text("2\n")
    before = sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))
    assert main([*command, "--data-dir", str(d)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"stratalog: error: data directory {d} {NEWER}"]
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*")) == before


# ---- what `serve` says ------------------------------------------------------------------

def _newer_marker(d: Path) -> str:
    d.mkdir()
    (d / datadir.MARKER).write_text("2\n")
    return f"data directory {d.resolve()} {NEWER}"


def _newer_database(d: Path) -> str:
    run(EmbeddedKV(d).close())
    with sqlite3.connect(d / DB_FILE) as db:
        db.execute("UPDATE meta SET value=2 WHERE name='format'")
    db.close()
    return f"coordinator: embedded coordinator database {d.resolve() / DB_FILE} {NEWER}"


def _newer_keyspace(d: Path) -> str:
    kv = EmbeddedKV(d)
    run(kv.put("/stratalog/default/keyspace_version", b"2"))
    run(kv.close())
    return f"coordinator keyspace /stratalog/default/ {NEWER}"


def test_spark_refuses_a_newer_coordinator_keyspace(tmp_path):
    """The Spark reader's coordinator mode (WAL reads up to the high watermark) checks the
    keyspace's version before it reads a key of it."""
    from stratalog.spark.metadata import CoordinatorMetadata

    d = tmp_path / "data"
    message = _newer_keyspace(d)
    reader = CoordinatorMetadata(str(d), "orders")
    try:
        with pytest.raises(CoordinatorFormat) as e:
            reader.snapshot()
    finally:
        reader.close()
    assert str(e.value) == message


@pytest.mark.parametrize("make", [_newer_marker, _newer_database, _newer_keyspace],
                         ids=["data-directory", "embedded-database", "keyspace"])
def test_serve_refuses_a_newer_format_in_one_line(tmp_path, make):
    d = tmp_path / "data"
    message = make(d)
    before = sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "serve", "--http", "off",
                           "--listen", "127.0.0.1:0", "--data-dir", str(d)],
                          cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.decode().splitlines() == [f"stratalog: error: {message}"]
    if make is _newer_marker:  # refused before anything was created in it
        assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*")) == before
    assert (d / datadir.MARKER).exists() == (make is _newer_marker)


def test_serve_leaves_a_newer_etcd_keyspace_untouched(etcd_server, tmp_path):
    """Without --broker-id a gateway on etcd allocates one: not in a keyspace it refuses."""
    prefix = "/stratalog/default/"

    async def keys(put: bytes | None = None) -> dict:
        kv = EtcdKV([etcd_server.endpoint])
        try:
            if put is not None:
                await kv.delete_prefix(prefix)
                await kv.put(prefix + "keyspace_version", put)
            return {k: v for k, v, _ in await kv.range(prefix)}
        finally:
            await kv.close()

    before = run(keys(put=b"2"))
    proc = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "serve", "--http", "off",
                           "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"),
                           "--coordinator", etcd_server.url],
                          cwd=ROOT, capture_output=True, timeout=60)
    assert proc.stderr.decode().splitlines() == [
        f"stratalog: error: coordinator keyspace {prefix} {NEWER}"]
    assert run(keys()) == before
