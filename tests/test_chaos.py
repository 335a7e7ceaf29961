"""Chaos: three gateways on a real etcd and moto's S3 server while gateways are killed,
etcd goes away, S3 misbehaves and a paused gateway comes back as a zombie. Each scenario
checks what clients were told against what the log holds afterwards."""

from __future__ import annotations

import signal
import time

import pytest

from cluster_fixtures import (  # noqa: F401 - etcd and moto_s3 are fixtures
    GroupConsumer, ProducerLoad, bootstrap_of, check_group, check_log, coordinator_snapshot,
    create_topic, etcd, group_committed, leaders, moto_s3, read_everything, start_cluster,
    try_leaders, unique_topic, wait_for)

pytestmark = pytest.mark.slow


def all_lead(bootstrap: str, topic: str, ids=(1, 2, 3)) -> bool:
    got = try_leaders(bootstrap, topic)
    return bool(got) and set(ids) <= set(got.values()) and -1 not in got.values()


@pytest.mark.timeout(420)
def test_rolling_kill9_with_idempotent_producers_and_a_group(gateway_factory, etcd, moto_s3, tmp_path):
    partitions = 12
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, s3=moto_s3,
                        **{"log.roll.ms": 8000, "log.retention.check.interval.ms": 2000})
    bootstrap = bootstrap_of(gws)
    topic = unique_topic("chaos-kill")
    create_topic(bootstrap, topic, partitions)
    wait_for(lambda: all_lead(bootstrap, topic), what="every gateway to lead")

    producers = [ProducerLoad(i, bootstrap, topic, partitions, rate=60) for i in (1, 2)]
    group = unique_topic("chaos-group")
    consumer = GroupConsumer(bootstrap, topic, group)
    clients = [*producers, consumer]
    for t in clients:
        t.start()
    try:
        # Every 10 s for 2 minutes one gateway (round robin) is killed with SIGKILL, and
        # restarted on its port and data directory 3 s later.
        kills = []
        started = time.monotonic()
        for k in range(12):
            time.sleep(max(0.0, started + 10 * (k + 1) - 3 - time.monotonic()))
            gw = gws[k % 3]
            kills.append(sum(p.ack_count() for p in producers))
            gw.kill9()
            time.sleep(3)
            t0 = time.monotonic()
            gw.start()
            print(f"kill {k}: gateway {k % 3 + 1} restarted in {time.monotonic() - t0:.1f} s")
        # Let the producers run on against the healed cluster, then drain them.
        time.sleep(5)
        kills.append(sum(p.ack_count() for p in producers))
        outstanding = [p.stop() for p in producers]
    except BaseException:
        for t in clients:
            t.stop(0) if isinstance(t, ProducerLoad) else t.stop()
        raise
    assert outstanding == [0, 0], f"delivery reports still outstanding: {outstanding}"
    for p in producers:
        assert not p.fatal, f"producer {p.producer_id} hit a fatal error: {p.fatal}"
        assert not p.produce_errors, f"producer {p.producer_id}: {p.produce_errors[:3]}"
        assert not p.failed, f"producer {p.producer_id}: {len(p.failed)} records failed, " \
                             f"first {p.failed[:3]}"
    total = sum(p.ack_count() for p in producers)
    # The clients, never restarted, kept being acknowledged between every two kills.
    assert all(b > a for a, b in zip(kills, kills[1:])), f"acks stalled: {kills}"

    log = read_everything(bootstrap, topic, partitions)
    assert sum(len(r) for r in log.values()) >= total
    check_log(log, producers)

    # The group catches up to the end, then we compare what it processed with the log.
    ends = {p: (records[-1][0] + 1 if records else 0) for p, records in log.items()}
    wait_for(lambda: all(consumer.committed.get(p, 0) >= e for p, e in ends.items() if e),
             timeout=90, what="the group to commit up to the end of the log")
    consumer.stop()
    assert not consumer.fatal, consumer.fatal
    committed = group_committed(bootstrap, topic, group, partitions)
    assert committed == {p: e for p, e in ends.items() if e}
    check_group(consumer, log, committed)

    wait_for(lambda: all_lead(bootstrap, topic), timeout=60,
             what="all three gateways to be live and lead partitions")
    for gw in gws:
        assert gw.proc.poll() is None, gw.log_tail()
