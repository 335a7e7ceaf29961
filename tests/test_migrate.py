"""`stratalog migrate`: an embedded installation moved to etcd and S3. Objects are copied
and checked by CRC-32C, the keyspace written into an empty etcd, both resumable; clients of
the cluster then see every acknowledged record, each consumer group resumes where it
committed and an idempotent producer's retry is still a duplicate.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stratalog.infra.cli import main
from stratalog.tiering.objectstore.file import list_files

from cluster_fixtures import (QUIET, coordinator_call, etcd, fault_proxy, moto_s3,  # noqa: F401  (fixtures)
                              start_cluster, wait_for)


# ---- the object copy -----------------------------------------------------------------------

def _stores(tmp_path: Path):
    from stratalog.tiering.objectstore import open_store

    return open_store((tmp_path / "src").as_uri()), open_store((tmp_path / "dst").as_uri())


@pytest.mark.unit
def test_copy_sends_each_object_once_checks_it_and_resumes(tmp_path):
    from stratalog.tiering.objectstore.copy import copy_objects

    src, dst = _stores(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    objects = {f"topics/t/{i}/{i:020d}.log": os.urandom(1000 * i + 1) for i in range(6)}
    objects["wal/1/00000000000000000001.wal"] = b""  # empty objects copy too

    async def body():
        for k, v in objects.items():
            await src.put(k, v)
        first = await copy_objects(src, dst, scratch, parallel=3)
        assert (first.copied, first.skipped, first.bytes_copied) == (7, 0, sum(map(len, objects.values())))
        for k, v in objects.items():
            assert await dst.get(k) == v
        # A rerun sends nothing; a target object with other bytes of the same size, or a
        # missing one, is sent again; one the source no longer has goes only with prune.
        damaged = "topics/t/3/00000000000000000003.log"
        await dst.put(damaged, bytes(len(objects[damaged])))
        await dst.delete(["topics/t/1/00000000000000000001.log"])
        await dst.put("wal/1/00000000000000000000.wal", b"left from an earlier pass")
        await dst.put("migration.json", b"{}")
        again = await copy_objects(src, dst, scratch, exclude=frozenset({"migration.json"}))
        assert (again.copied, again.skipped, again.removed) == (2, 5, 0)
        assert await dst.get(damaged) == objects[damaged]
        pruned = await copy_objects(src, dst, scratch, exclude=frozenset({"migration.json"}), prune=True)
        assert (pruned.copied, pruned.skipped, pruned.removed) == (0, 7, 1)
        assert sorted(o.key for o in await dst.list("")) == sorted([*objects, "migration.json"])
        assert list(scratch.iterdir()) == []

    asyncio.run(body())


@pytest.mark.unit
def test_a_journal_spares_reading_checked_objects_again(tmp_path):
    from stratalog.tiering.objectstore.copy import CrcJournal, copy_objects

    src, dst = _stores(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "journal"
    objects = {f"topics/t/0/{i:020d}.log": os.urandom(500 + i) for i in range(4)}

    async def copy(**options):
        journal = CrcJournal(path, src.url)
        try:
            return await copy_objects(src, dst, scratch, journal=journal, **options)
        finally:
            journal.close()

    async def body():
        for k, v in objects.items():
            await src.put(k, v)
        assert (await copy()).copied == 4
        reads = src.stats["get"]
        assert (await copy()).skipped == 4 and src.stats["get"] == reads  # the source is not read
        # A crash mid-line: that object alone is read again, and the journal goes on.
        with open(path, "a") as f:
            f.write("0000")
        damaged = next(iter(objects))
        await dst.put(damaged, bytes(len(objects[damaged])))  # the target is still checked
        assert ((await copy()).copied, src.stats["get"] > reads) == (1, True)
        assert await dst.get(damaged) == objects[damaged]
        reads = src.stats["get"]
        assert (await copy()).skipped == 4 and src.stats["get"] == reads
        # A journal of another source is started over.
        journal = CrcJournal(path, "file:///elsewhere")
        journal.close()
        assert path.read_text() == "STRATALOG-CRC32C-JOURNAL 1 file:///elsewhere\n"

    asyncio.run(body())


# ---- the keyspace --------------------------------------------------------------------------

@pytest.mark.unit
def test_keyspace_write_resumes_its_own_target_and_refuses_any_other(tmp_path):
    from stratalog.coordinator import open_coordinator
    from stratalog.coordinator import migration
    from stratalog.coordinator.kv import Put
    from stratalog.coordinator.model import CommittedOffset, PartitionState

    async def body():
        source = open_coordinator(None, tmp_path / "source")
        try:
            await source.cluster_id()
            await source.create_topic("t", 2, 1, {"cleanup.policy": "compact"},
                                      {p: PartitionState(1, 3, (1,), (1,)) for p in range(2)})
            await source.commit_offsets("g", {("t", 0): CommittedOffset(5, 3, "", 0)})
            await source.allocate_producer_ids(1000)
            _, keys = await source.read_keyspace()
        finally:
            await source.close()
        cid = json.loads(dict(keys)["cluster_id"])

        target = open_coordinator(None, tmp_path / "target")
        try:
            assert await migration.claim(target, cid, "here") == migration.NEW
            with pytest.raises(migration.MigrationUnderWay, match="is being written by"):
                await migration.check_finished(target)  # what a gateway starting now is told
            # A run that stopped after part of the keys, and left one the source no longer has.
            await target.kv.txn([], [Put(target.prefix + k, v) for k, v in keys[: len(keys) // 2]])
            await target.kv.put(target.prefix + "segments/gone/0/00000000000000000000", b"{}")
            assert await migration.claim(target, cid, "here") == migration.RESUMING
            with pytest.raises(migration.TargetInUse, match="from another installation"):
                await migration.claim(target, "another-id", "there")
            put, deleted = await migration.write(target, keys)
            assert deleted == 1 and put >= 1
            _, written = await target.read_keyspace()
            # Equal to the source, but the marker and the deletes' mark for gateways' indexes.
            assert sorted(k for k in written if k[0] not in (migration.MARKER, "index_deletions")) == sorted(keys)
            assert (await target.topic("t")).configs == {"cleanup.policy": "compact"}
            assert (await target.fetch_offsets("g"))[("t", 0)].offset == 5
            assert await migration.claim(target, cid, "here") == migration.COMPLETE
            await migration.check_finished(target)  # gateways may start
        finally:
            await target.close()

        other = open_coordinator(None, tmp_path / "other")
        try:
            await other.cluster_id()  # a cluster of its own
            with pytest.raises(migration.TargetInUse, match="holds 1 keys and no migration"):
                await migration.claim(other, cid, "here")
        finally:
            await other.close()

    asyncio.run(body())


@pytest.mark.unit
def test_refusals_of_a_bad_argument_or_a_bucket_holding_anything_else(tmp_path, capsys):
    from stratalog.coordinator import open_coordinator

    data_dir = tmp_path / "data"

    async def install():
        store = open_coordinator(None, data_dir)
        try:
            await store.cluster_id()
        finally:
            await store.close()
    asyncio.run(install())
    (data_dir / "objects/topics").mkdir(parents=True)
    (data_dir / "objects/topics/a.log").write_bytes(b"a")
    target = tmp_path / "target"

    def migrate(*extra: str) -> int:
        return main(["migrate", "--objects-only", "--data-dir", str(data_dir), "--object-store",
                     target.as_uri(), *extra])

    for extra, code, message in [
            (["--parallel", "0"], 2, "must be at least 1"),
            (["--parallel", "65"], 2, "--parallel is at most 64"),
            (["--coordinator", "embedded"], 2, "--coordinator must name an etcd cluster"),
            (["--from-object-store", target.as_uri()], 2, "is the installation's own store")]:
        assert migrate(*extra) == code
        assert message in capsys.readouterr().err
    assert main(["migrate", "--objects-only", "--data-dir", str(tmp_path / "none"), "--object-store",
                 target.as_uri()]) == 1
    assert "no embedded installation in" in capsys.readouterr().err

    (target / "topics").mkdir(parents=True)
    (target / "topics/b.log").write_bytes(b"b")  # someone else's
    assert migrate() == 1
    assert "holds 1 objects that no migration of this installation copied" in capsys.readouterr().err
    (target / "topics/b.log").unlink()
    (target / "migration.json").write_text(json.dumps({"cluster_id": "another", "source": "/elsewhere"}))
    assert migrate() == 1
    assert "migrated from another installation (/elsewhere)" in capsys.readouterr().err
    (target / "migration.json").unlink()

    # Another run copying from the same directory is refused; files a killed run left in
    # the scratch folder are removed by the next, which leaves none.
    import fcntl

    with open(data_dir / "migrate-scratch.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert migrate() == 1
    assert "another `stratalog migrate` is copying from" in capsys.readouterr().err
    (data_dir / "migrate-scratch").mkdir()
    (data_dir / "migrate-scratch/object-7").write_bytes(b"left by a run killed with -9")
    assert migrate() == 0
    assert (target / "topics/a.log").read_bytes() == b"a"
    assert "1 copied" in capsys.readouterr().out
    assert not (data_dir / "migrate-scratch").exists()


# ---- end to end ----------------------------------------------------------------------------

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,  # noqa: E402
                                   AdminClient, NewTopic, ResourcePatternType, ResourceType,
                                   ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)

# ACLs on, with everything allowed that no ACL names: so the test's clients need none.
ACLS_ON = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
           "allow.everyone.if.no.acl.found": "true"}


def _idempotent_batch(seq: int, pid: int, epoch: int) -> bytes:
    from stratalog.tiering.batch import build_batch

    return build_batch([(b"idem", f"record-{seq}".encode(), [])], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq)


class _IdempotentProducer:
    """An idempotent producer by hand, so its last batch can be sent again as a retry."""

    def __init__(self, bootstrap: str, pid: int | None = None, epoch: int = -1):
        import raw_client
        from stratalog.gateway.protocol.catalog import ApiKey

        self.api = ApiKey
        self.raw = raw_client.Raw(bootstrap)
        if pid is not None:  # the same producer, on another connection
            self.pid, self.epoch = pid, epoch
            return
        got = self.raw.call(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                                         "producer_id": -1, "producer_epoch": -1})
        assert got.error_code == 0, got
        self.pid, self.epoch = got.producer_id, got.producer_epoch

    def send(self, topic: str, batch: bytes) -> tuple[int, int]:
        resp = self.raw.call(self.api.PRODUCE, 9, {
            "transactional_id": None, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
        answer = resp.responses[0].partition_responses[0]
        return answer.error_code, answer.base_offset


def _migrate_args(data_dir: Path, etcd_url: str, s3, endpoint: str | None = None) -> list[str]:
    return ["migrate", "--data-dir", str(data_dir), "--coordinator", etcd_url, "--object-store", s3.url,
            "--s3-endpoint", endpoint or s3.endpoint, "--s3-path-style"]


@pytest.fixture(scope="module")
def spark():
    from spark_helpers import spark_session

    return spark_session()


def test_migrate_an_embedded_installation_to_etcd_and_s3(gateway_factory, etcd, fault_proxy, moto_s3,  # noqa: F811
                                                         tmp_path, capsys, monkeypatch, spark):
    from test_coordinator_backup import _commit, _partition_view, _produce, _read_all, _records, _store_call

    from s3_fault_proxy import FaultRule

    data_dir = tmp_path / "data"
    gw = gateway_factory(data_dir=data_dir, settings={"log.segment.bytes": 1400, **ACLS_ON})
    admin = AdminClient({"bootstrap.servers": gw.bootstrap, "logger": QUIET})
    secret_acl = AclBinding(ResourceType.TOPIC, "secret", ResourcePatternType.LITERAL, "User:alice", "*",
                            AclOperation.READ, AclPermissionType.ALLOW)
    for f in admin.create_acls([secret_acl], request_timeout=15).values():
        f.result(30)
    alice = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"alice-pw")
    admin.alter_user_scram_credentials([alice])["alice"].result(30)
    for new in (NewTopic("orders", 2, 1), NewTopic("idem", 1, 1), NewTopic("trimmed", 1, 1),
                NewTopic("latest", 1, 1, config={"cleanup.policy": "compact", "segment.bytes": "1400"})):
        admin.create_topics([new])[new.topic].result(30)
    orders = _records(20, 2)  # 10 a partition: sealed segments, then records only in the WAL
    _produce(gw.bootstrap, "orders", orders)
    latest = [(0, f"key{i % 3}".encode(), f"value{i}-".encode() + b"y" * 300, []) for i in range(9)]
    _produce(gw.bootstrap, "latest", latest)
    # Compacted data: `latest`'s sealed segments rewritten to the newest record of each key
    # (stratalog compact, on Spark), the last segment and the WAL left as they are.
    from spark_helpers import consume_all, wait_sealed

    from stratalog.spark.compaction import compact
    from stratalog.spark.objects import StoreSpec

    wait_sealed(StoreSpec((data_dir / "objects").as_uri()), "latest", {0: 3})
    report = compact(spark, (data_dir / "objects").as_uri(), "latest", gw.http_url, bootstrap=gw.bootstrap)
    assert report.ok and [r.status for r in report.results] == ["compacted"], report.results
    kept = len(consume_all(gw.bootstrap, "latest", 1))
    assert kept < len(latest)
    _produce(gw.bootstrap, "trimmed", _records(5, 1, size=10))
    trim = admin.delete_records([TopicPartition("trimmed", 0, 2)])  # log start offset 2
    next(iter(trim.values())).result(30)
    producer = _IdempotentProducer(gw.bootstrap)
    acked = [producer.send("idem", _idempotent_batch(seq, producer.pid, producer.epoch)) for seq in range(3)]
    assert acked == [(0, 0), (0, 1), (0, 2)]
    _commit(gw.bootstrap, "billing", "orders", {0: 4, 1: 7})
    before = {"orders": _read_all(gw.bootstrap, "orders", [0, 1], {0: 10, 1: 10}),
              "latest": _read_all(gw.bootstrap, "latest", [0], {0: kept}),
              "idem": _read_all(gw.bootstrap, "idem", [0], {0: 3})}

    # A first copy beside the running gateway; the rest is refused while it runs.
    store = ["--object-store", moto_s3.url, "--s3-endpoint", moto_s3.endpoint, "--s3-path-style"]
    assert main(["migrate", "--objects-only", "--data-dir", str(data_dir), *store]) == 0
    assert "objects:" in capsys.readouterr().out
    precopied = set(moto_s3.keys())
    assert any(k.startswith("topics/") for k in precopied) and "migration.json" in precopied
    assert main(_migrate_args(data_dir, etcd.url, moto_s3)) == 1
    assert "a gateway is running on" in capsys.readouterr().err
    producer.raw.close()
    gw.stop()
    view = _store_call(None, data_dir, _partition_view)
    for tp in [("orders", 0), ("orders", 1), ("latest", 0)]:
        _, segments, wal, _ = view[tp]
        assert segments and wal, (tp, view[tp])  # sealed records, and records only in the WAL

    # Bad arguments and a target someone else uses: one line, non-zero, nothing written.
    assert main(["migrate", "--data-dir", str(data_dir), *store]) == 2
    assert "--coordinator etcd://HOST:PORT is required" in capsys.readouterr().err
    assert main(["migrate", "--data-dir", str(tmp_path / "nowhere"), "--coordinator", etcd.url, *store]) == 1
    assert "no embedded installation in" in capsys.readouterr().err
    coordinator_call(etcd.url, lambda s: s.kv.put(s.prefix + "cluster_id", b'"someone-else"'))
    assert main(_migrate_args(data_dir, etcd.url, moto_s3)) == 1
    assert "no migration of this installation wrote them" in capsys.readouterr().err
    coordinator_call(etcd.url, lambda s: s.kv.delete_prefix(s.prefix))
    assert set(moto_s3.keys()) == precopied

    # kill -9 mid-copy: WAL objects (copied last: keys sort after topics/) hang at the proxy.
    source_wal = sorted(str(p.relative_to(data_dir / "objects")) for p in (data_dir / "objects/wal").rglob("*.wal"))
    assert source_wal
    moto_s3.client().delete_objects(Bucket=moto_s3.bucket, Delete={
        "Objects": [{"Key": f"{moto_s3.prefix}/{k}"} for k in source_wal if k in precopied]})
    fault_proxy.set_rules(FaultRule(("PUT",), "stall", key_contains="/wal/"))
    proc = subprocess.Popen([sys.executable, "-m", "stratalog", *_migrate_args(
        data_dir, etcd.url, moto_s3, fault_proxy.endpoint), "--parallel", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: fault_proxy.held() or proc.poll() is not None, timeout=60, what="a stalled WAL copy")
        assert proc.poll() is None, proc.communicate()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    fault_proxy.clear()
    fault_proxy.release()
    assert not set(source_wal) <= set(moto_s3.keys())  # interrupted half way
    assert any((data_dir / "migrate-scratch").iterdir())  # the killed run's, removed by the next

    # The next run copies the difference; then etcd stops answering as the topics are written.
    from stratalog.coordinator.etcd import EtcdKV
    from stratalog.coordinator.kv import CoordinatorUnavailable, Put

    real_txn = EtcdKV.txn

    async def txn_failing_at_topics(self, compares, success, failure=()):
        if any(isinstance(op, Put) and "/topics/" in op.key for op in success):
            raise CoordinatorUnavailable("etcd stopped answering (injected)")
        return await real_txn(self, compares, success, failure)
    monkeypatch.setattr(EtcdKV, "txn", txn_failing_at_topics)
    requests = dict(fault_proxy.requests)
    assert main(_migrate_args(data_dir, etcd.url, moto_s3, fault_proxy.endpoint)) == 1
    monkeypatch.setattr(EtcdKV, "txn", real_txn)
    out, err = capsys.readouterr()
    assert "etcd stopped answering (injected) (run it again to continue)" in err, err
    copied, skipped = (int(out.split("objects: ", 1)[1].split(" copied")[0]),
                       int(out.split(" bytes), ", 1)[1].split(" already there")[0]))
    assert 0 < copied <= len(source_wal) + 1 and skipped > 10, out  # only the difference
    # Objects already there were checked by the CRC-32C S3 keeps (HEAD), not downloaded:
    # the stop a migration needs does not grow with what the first pass copied.
    sent = {op: n - requests.get(op, 0) for op, n in fault_proxy.requests.items()}
    assert sent.get("GET", 0) <= 2 and sent["HEAD"] >= copied + skipped, sent  # GETs: the marker
    _, partial = coordinator_call(etcd.url, lambda s: s.read_keyspace())
    assert any(k.startswith("segments/") for k, _ in partial)
    assert not any(k.startswith("topics/") for k, _ in partial)

    # A gateway started on the cluster now refuses: its keys are not all there yet.
    from conftest import free_port

    early = subprocess.run([sys.executable, "-m", "stratalog", "serve", "--listen", f"127.0.0.1:{free_port()}",
                            "--data-dir", str(tmp_path / "early"), "--coordinator", etcd.url,
                            "--object-store", moto_s3.url, "--s3-endpoint", moto_s3.endpoint, "--s3-path-style"],
                           capture_output=True, text=True, timeout=120)
    assert early.returncode != 0 and "is being written by `stratalog migrate`" in early.stderr, early.stderr

    # Run again: nothing left to copy, the keys finished.
    assert main(_migrate_args(data_dir, etcd.url, moto_s3)) == 0
    out = capsys.readouterr().out
    assert "(resumed)" in out and "objects: 0 copied" in out and "migrated" in out, out
    assert not (data_dir / "migrate-scratch").exists()
    # The file store's own listing: its temporary files are no objects.
    objects = {o.key for o in list_files(data_dir / "objects", "")}
    assert set(moto_s3.keys()) == objects | {"migration.json"}
    assert main(_migrate_args(data_dir, etcd.url, moto_s3)) == 0
    assert "nothing to do" in capsys.readouterr().out

    # etcd holds the installation's keys, every one, and only those (but the marker).
    _, source_keys = _store_call(None, data_dir, lambda s: s.read_keyspace())
    _, target_keys = coordinator_call(etcd.url, lambda s: s.read_keyspace())
    assert sorted(k for k in target_keys if k[0] not in ("migration", "index_deletions")) == \
        sorted(k for k in source_keys if k[0] != "index_deletions")
    # No value names the old store: objects are named by keys relative to a store.
    assert not any(b"file:" in v or str(data_dir).encode() in v for k, v in target_keys if k != "migration")

    # The cluster serves it: every record as acknowledged, offsets and producer state carried.
    (cgw,) = start_cluster(gateway_factory, etcd, tmp_path, 1, s3=moto_s3, **ACLS_ON)
    cadmin = AdminClient({"bootstrap.servers": cgw.bootstrap, "logger": QUIET})
    every_acl = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                 AclPermissionType.ANY)
    assert cadmin.describe_acls(every_acl).result(30) == [secret_acl]
    users = cadmin.describe_user_scram_credentials(["alice"])["alice"].result(30)
    assert [(c.mechanism, c.iterations) for c in users.scram_credential_infos] == [(ScramMechanism.SCRAM_SHA_256, 4096)]
    watermarks = Consumer({"bootstrap.servers": cgw.bootstrap, "group.id": "w", "logger": QUIET})
    try:
        assert watermarks.get_watermark_offsets(TopicPartition("trimmed", 0), timeout=30) == (2, 5)
    finally:
        watermarks.close()
    after = {"orders": _read_all(cgw.bootstrap, "orders", [0, 1], {0: 10, 1: 10}),
             "latest": _read_all(cgw.bootstrap, "latest", [0], {0: kept}),
             "idem": _read_all(cgw.bootstrap, "idem", [0], {0: 3})}
    assert after == before
    assert [r[1:] for p in (0, 1) for r in after["orders"][p]] == \
        [(k, v, h) for p in (0, 1) for (pp, k, v, h) in orders if pp == p]

    consumer = Consumer({"bootstrap.servers": cgw.bootstrap, "group.id": "billing", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "logger": QUIET})
    consumer.subscribe(["orders"])
    resumed: list[tuple[int, int]] = []
    try:
        wait_for(lambda: _poll_into(consumer, resumed) and len(resumed) >= 6 + 3, timeout=60,
                 what="the group's remaining records", interval=0)
        for _ in range(10):  # nothing more, nothing twice
            _poll_into(consumer, resumed)
    finally:
        consumer.close()
    assert sorted(resumed) == [(0, o) for o in range(4, 10)] + [(1, o) for o in range(7, 10)]

    retry = _IdempotentProducer(cgw.bootstrap, producer.pid, producer.epoch)
    try:
        def duplicate():
            code, offset = retry.send("idem", _idempotent_batch(2, producer.pid, producer.epoch))
            return (code, offset) if code == 0 else None
        assert wait_for(duplicate, timeout=30, what="the retried batch answered") == (0, 2)
        assert retry.send("idem", _idempotent_batch(3, producer.pid, producer.epoch)) == (0, 3)
    finally:
        retry.raw.close()
    assert [r[2] for r in _read_all(cgw.bootstrap, "idem", [0], {0: 4})[0]] == \
        [b"record-0", b"record-1", b"record-2", b"record-3"]


def _poll_into(consumer, out: list) -> bool:
    msg = consumer.poll(0.5)
    if msg is not None and not msg.error():
        out.append((msg.partition(), msg.offset()))
    return True
