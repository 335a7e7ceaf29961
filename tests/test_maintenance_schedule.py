"""A gateway's maintenance tick: retention and the whole garbage collection every
log.retention.check.interval.ms; the obsolete WAL objects alone every
wal.collection.interval.ms, which on the embedded coordinator defaults to a few seconds
so that no pass meets a minute of WAL objects."""

from __future__ import annotations

import asyncio

import pytest

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.etcd import EtcdKV
from stratalog.coordinator.store import KVClusterStore
from stratalog.gateway.broker import Broker
from stratalog.gateway.config import EMBEDDED_WAL_COLLECTION_MS, BrokerConfig
from stratalog.tiering.objectstore import open_store

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def broker_on(tmp_path, store, clock=None, **settings) -> Broker:
    return Broker(BrokerConfig({k.replace("_", "."): v for k, v in settings.items()}), node_id=1,
                  advertised=("127.0.0.1", 1), data_dir=tmp_path / "data", store=store,
                  objects=open_store((tmp_path / "objects").as_uri()), clock=clock or Clock())


def test_the_embedded_coordinator_collects_obsolete_wal_objects_between_cleanings(tmp_path):
    clock = Clock()

    async def run():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        broker = broker_on(tmp_path, store, clock, log_retention_check_interval_ms=60_000)
        ran: list[tuple[str, float]] = []
        for name in ("clean", "collect_obsolete_wal_objects"):
            real = getattr(broker.engine, name)

            async def counted(real=real, name=name):
                ran.append((name, clock.now))
                await real()
            setattr(broker.engine, name, counted)
        try:
            start = clock.now
            while clock.now - start <= 61:
                await broker.maintain_once()
                clock.now += 0.25
        finally:
            await store.close()
        return start, ran

    start, ran = asyncio.run(run())
    step = EMBEDDED_WAL_COLLECTION_MS / 1000
    collections = [start + step * i for i in range(1, int(60 / step))]
    assert ran == [("clean", start), *(("collect_obsolete_wal_objects", t) for t in collections),
                   ("clean", start + 60)]


def test_wal_collection_interval_defaults_by_coordinator_and_can_be_set(tmp_path):
    embedded = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
    etcd = KVClusterStore(EtcdKV([("127.0.0.1", 1)]))  # never connected: nothing is read
    try:
        assert (embedded.in_process, etcd.in_process) == (True, False)
        assert broker_on(tmp_path, embedded).wal_collection_interval_s == EMBEDDED_WAL_COLLECTION_MS / 1000
        assert broker_on(tmp_path, etcd, log_retention_check_interval_ms=90_000
                         ).wal_collection_interval_s == 90
        assert broker_on(tmp_path, etcd, wal_collection_interval_ms=2_000).wal_collection_interval_s == 2
        assert broker_on(tmp_path, embedded, wal_collection_interval_ms=0).wal_collection_interval_s == 0
    finally:
        asyncio.run(embedded.close())
