"""Upgrades: data written by released versions, opened by today's gateway.

Every folder under tests/fixtures/upgrade/ holds what one release left behind (its README
names the commit): `embedded/data/`, a data directory, and `cluster/`, an etcd keyspace
dump plus the bucket's objects. tools/make_upgrade_fixture.py wrote them by driving that
release from outside and recorded in each `expected.json` what clients saw before it
stopped. Today's gateway must show clients exactly the same: every record (offset, leader
epoch, timestamp, key, value, headers), watermarks and offsets by time, every group
offset, every topic config, and a retried idempotent batch answered as a duplicate. Then
the upgraded installation must keep working: new records, new commits, and a restart.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from cluster_fixtures import coordinator_call, etcd, moto_s3  # noqa: F401 - fixtures
from conftest import ROOT
from stratalog.coordinator.store import KEYSPACE_VERSION
from stratalog.gateway import datadir

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "upgrade"
VERSIONS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
# What `observe` returns that must not change across an upgrade.
SECTIONS = ("probes", "topics", "configs", "offsets", "records", "times", "groups")


def _tool():
    """tools/make_upgrade_fixture.py, which reads fixtures the way it wrote them."""
    spec = importlib.util.spec_from_file_location("make_upgrade_fixture",
                                                  ROOT / "tools" / "make_upgrade_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _tool()


def _expected(folder: Path) -> dict:
    return json.loads((folder / "expected.json").read_text())


def _check_same(expected: dict, observed: dict) -> None:
    for section in SECTIONS:
        if section not in expected:
            continue  # a fixture older than the section
        want, got = expected[section], observed[section]
        if isinstance(want, dict):
            assert sorted(got) == sorted(want), f"{section}: different keys"
            for key in want:
                assert got[key] == want[key], f"{section} of {key} differ after the upgrade"
        else:
            assert got == want, f"{section} differ after the upgrade"


def _keeps_working(gw, expected: dict) -> None:
    """New writes land after the old data, the old producer continues its sequence, a new
    commit is kept, and everything survives a restart of today's gateway."""
    latest = {tp: o["latest"] for tp, o in expected["offsets"].items()}
    raw = tool.RawClient(gw.bootstrap)
    for probe in expected["plan"]["probes"]:
        tp = f"{probe['topic']}/{probe['partition']}"
        last = probe["batches"][-1]
        seq = last["base_sequence"] + last["records"]
        batch = tool.probe_batch(probe["producer_id"], probe["producer_epoch"], seq, 1)
        assert raw.produce(probe["topic"], probe["partition"], batch) == (0, latest[tp]), \
            f"{tp}: the next batch of idempotent producer {probe['producer_id']}"
        latest[tp] += 1
    raw.close()

    producer = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
    delivered: dict[str, int] = {}

    def done(err, msg):
        assert err is None, err
        delivered[f"{msg.topic()}/{msg.partition()}"] = msg.offset()

    for tp in sorted(latest):
        topic, p = tp.rsplit("/", 1)
        producer.produce(topic, key=b"after", value=f"upgraded {tp}".encode(), partition=int(p),
                         on_delivery=done)
    assert producer.flush(30) == 0
    assert delivered == latest, "new records must follow the old ones"

    consumer = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "billing",
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition("orders", 1, 5, "after the upgrade")], asynchronous=False)
    consumer.close()

    gw.stop()
    gw.start()
    plan = expected["plan"]
    again = tool.observe(gw.bootstrap, plan)
    # The original probe batches are still recognised after the producer wrote more.
    assert again["probes"] == expected["probes"]
    assert again["configs"] == expected["configs"]
    groups = json.loads(json.dumps(expected["groups"]))
    groups["billing"]["orders/1"] = {"offset": 5, "metadata": "after the upgrade",
                                     "leader_epoch": None}
    assert again["groups"] == groups
    for tp, records in expected["records"].items():
        got = again["records"][tp]
        assert got[:len(records)] == records, f"{tp}: old records changed after a restart"
        assert got[-1]["value"] == tool.b64(f"upgraded {tp}".encode())
        assert again["offsets"][tp]["latest"] == latest[tp] + 1


@pytest.mark.parametrize("version", VERSIONS)
def test_embedded_data_directory_opens_with_todays_gateway(version, gateway_factory, tmp_path):
    folder = FIXTURES / version / "embedded"
    expected = _expected(folder)
    data = tmp_path / "data"
    shutil.copytree(folder / "data", data)
    gw = gateway_factory(settings=expected["open_with"], data_dir=data)
    _check_same(expected, tool.observe(gw.bootstrap, expected["plan"]))
    # Today's gateway marked what it opened (0.1.0 wrote no markers) with its versions.
    assert (data / datadir.MARKER).read_text() == f"{datadir.FORMAT_VERSION}\n"
    with sqlite3.connect(f"file:{data / 'coordinator.sqlite3'}?mode=ro", uri=True) as db:
        (version,) = db.execute("SELECT value FROM kv WHERE key = ?",
                                (b"/stratalog/default/keyspace_version",)).fetchone()
    db.close()
    assert json.loads(version) == KEYSPACE_VERSION
    _keeps_working(gw, expected)


@pytest.mark.parametrize("version", VERSIONS)
def test_cluster_keyspace_and_bucket_open_with_todays_gateway(version, etcd, moto_s3,
                                                              gateway_factory, tmp_path):
    # etcd and S3 are listed first so that they outlive the gateway at teardown.
    folder = FIXTURES / version / "cluster"
    expected = _expected(folder)
    tool.load_keyspace(etcd.client_port, json.loads((folder / "keyspace.json").read_text()))
    assert tool.upload_bucket(moto_s3.endpoint, moto_s3.bucket, moto_s3.prefix,
                              folder / "bucket") > 0
    gw = gateway_factory(settings=expected["open_with"], extra_args=[
        "--coordinator", etcd.url, "--object-store", moto_s3.url,
        "--s3-endpoint", moto_s3.endpoint, "--s3-path-style"])
    _check_same(expected, tool.observe(gw.bootstrap, expected["plan"]))
    got = coordinator_call(etcd.url, lambda s: s.kv.get(s.prefix + "keyspace_version"))
    assert got is not None and json.loads(got[0]) == KEYSPACE_VERSION
    _keeps_working(gw, expected)
