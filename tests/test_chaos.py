"""Chaos: three gateways on a real etcd and moto's S3 server while gateways are killed,
etcd goes away, S3 misbehaves and a paused gateway comes back as a zombie. Each scenario
checks what clients were told against what the log holds afterwards."""

from __future__ import annotations

import signal
import time

import pytest

from cluster_fixtures import (  # noqa: F401 - etcd and moto_s3 are fixtures
    GroupConsumer, ProducerLoad, bootstrap_of, check_group, check_log, coordinator_snapshot,
    create_topic, etcd, fault_proxy, group_committed, leaders, log_clients_to, moto_s3,
    orphaned_objects, read_everything, restart_all, start_cluster, stop_and_check_producers, try_leaders, unique_topic,
    wait_for, WatermarkReader)
from s3_fault_proxy import FaultRule
from stratalog.tiering.batch import scan_batches
from stratalog.tiering.layout import parse_wal_key

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def all_lead(bootstrap: str, topic: str, ids=(1, 2, 3)) -> bool:
    got = try_leaders(bootstrap, topic)
    return bool(got) and set(ids) <= set(got.values()) and -1 not in got.values()


@pytest.mark.timeout(420)
def test_rolling_kill9_with_idempotent_producers_and_a_group(etcd, moto_s3, gateway_factory, tmp_path):
    partitions = 12
    log_clients_to(tmp_path / "clients.log")
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
        # Every 10 s for 90 s one gateway (round robin, three times each) is killed with
        # SIGKILL, and restarted on its port and data directory 3 s later.
        kills = []
        started = time.monotonic()
        for k in range(9):
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
    except BaseException:
        for t in clients:
            t.stop(0) if isinstance(t, ProducerLoad) else t.stop()
        raise
    stop_and_check_producers(producers)
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
    print(f"group member restarted {consumer.replaced} time(s) after a client stall")
    assert not consumer.fatal, consumer.fatal
    committed = group_committed(bootstrap, topic, group, partitions)
    assert committed == {p: e for p, e in ends.items() if e}
    check_group(consumer, log, committed)

    wait_for(lambda: all_lead(bootstrap, topic), timeout=60,
             what="all three gateways to be live and lead partitions")
    for gw in gws:
        assert gw.proc.poll() is None, gw.log_tail()


def acks_between(producers, start: float, end: float) -> list:
    return [a for p in producers for a in p.acks if start < a.at < end]


@pytest.mark.timeout(300)
def test_etcd_outage_stops_acks_all_until_it_is_back(etcd, moto_s3, gateway_factory, tmp_path):
    partitions = 6
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, s3=moto_s3)
    bootstrap = bootstrap_of(gws)
    topic = unique_topic("chaos-etcd")
    create_topic(bootstrap, topic, partitions)
    wait_for(lambda: all_lead(bootstrap, topic), what="every gateway to lead")
    producer = ProducerLoad(1, bootstrap, topic, partitions, rate=80)
    producer.start()
    watermarks = WatermarkReader(bootstrap)
    try:
        wait_for(lambda: producer.ack_count() >= 200, what="the first acknowledgements")
        # Once paused (SIGSTOP: requests hang) and once restarted (stop: refused, then a
        # fresh etcd process on the same data directory).
        for outage, done in (("pause", "paused"), ("restart", "restarted")):
            watermarks.read(topic, partitions)  # knows the leaders of now before etcd goes
            down_at = time.monotonic()
            if outage == "pause":
                etcd.proc.send_signal(signal.SIGSTOP)
            else:
                etcd.stop()
            time.sleep(2)
            # Nothing can be committed now, so the high watermarks the leaders answer stay
            # where the last commits before the outage left them (gateways answer from
            # memory). A record acknowledged during the outage must either come in the
            # first second (the reply to a commit etcd made just before it went) or lie
            # below them: a retry of a batch already committed is answered with its
            # original offset. Anything else was acknowledged without a commit. A
            # partition whose leadership was moving when etcd went may have no leader to
            # answer (0: nothing past the first second is allowed there).
            committed = watermarks.read(topic, partitions, timeout=down_at + 7.5 - time.monotonic(),
                                        unanswered=0)
            time.sleep(max(0.0, down_at + 8 - time.monotonic()))
            up_at = time.monotonic()
            if outage == "pause":
                etcd.proc.send_signal(signal.SIGCONT)
            else:
                etcd.start()
            during = acks_between([producer], down_at, up_at)
            uncommitted = [a for a in during if a.at > down_at + 1.0
                           and (a.offset is None or not 0 <= a.offset < committed[a.partition])]
            assert not uncommitted, f"{len(uncommitted)} records acknowledged while etcd was " \
                                    f"{done}, after its first second and past the high watermarks {committed}, " \
                                    f"first {uncommitted[0]}"
            assert producer.failed == [], producer.failed[:3]
            wait_for(lambda: len(acks_between([producer], up_at, float("inf"))) >= 200, timeout=60,
                     what=f"acknowledgements to resume after the etcd {outage}")
    except BaseException:
        producer.stop(0)
        raise
    finally:
        watermarks.close()
    stop_and_check_producers([producer])
    for gw in gws:
        assert gw.proc.poll() is None, gw.log_tail()
    check_log(read_everything(bootstrap, topic, partitions), [producer])


S3_FAULTS = (
    # One stall each for an upload and a read: held until the gateway's S3 read timeout.
    FaultRule(("PUT",), "stall", fraction=0.05, count=1),
    FaultRule(("GET",), "stall", fraction=0.05, count=1),
    FaultRule(("PUT", "GET"), "500", fraction=0.06),
    FaultRule(("PUT", "GET"), "503", fraction=0.06),
    FaultRule(("PUT", "GET"), "drop", fraction=0.04),
    FaultRule(("PUT",), "lost_reply", fraction=0.04),
    FaultRule(("LIST", "DELETE", "HEAD"), "503", fraction=0.05),
)


@pytest.mark.timeout(420)
def test_s3_faults_never_lose_acknowledged_data_or_leak_objects(etcd, moto_s3, fault_proxy,
                                                                 gateway_factory, tmp_path):
    partitions = 6
    proxy = fault_proxy
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, s3=moto_s3, s3_endpoint=proxy.endpoint,
                        **{"log.roll.ms": 2000, "log.retention.check.interval.ms": 1000,
                           # a stalled request is abandoned and retried after 3 s, not 60 s
                           "s3.read.timeout.ms": 3000})
    bootstrap = bootstrap_of(gws)
    topic = unique_topic("chaos-s3")
    create_topic(bootstrap, topic, partitions)
    wait_for(lambda: all_lead(bootstrap, topic), what="every gateway to lead")
    producer = ProducerLoad(1, bootstrap, topic, partitions, rate=60)
    producer.start()
    try:
        wait_for(lambda: producer.ack_count() >= 100, what="the first acknowledgements")
        proxy.set_rules(*S3_FAULTS)
        time.sleep(12)
        # Every gateway dies at once while faults go on; each rebuilds what it leads
        # from the store through the same faults.
        restart_all(gws)
        before = producer.ack_count()
        wait_for(lambda: producer.ack_count() >= before + 300, timeout=120,
                 what="acknowledgements to go on after the restart")
    except BaseException:
        producer.stop(0)
        raise
    stop_and_check_producers([producer], 180)
    for action in ("500", "503", "drop", "lost_reply", "stall"):
        assert proxy.count("PUT", action) > 0, f"no PUT got {action}: {proxy.faults}"
    assert proxy.count("GET") > 0, proxy.faults

    check_log(read_everything(bootstrap, topic, partitions), [producer])
    restart_all(gws)
    check_log(read_everything(bootstrap, topic, partitions), [producer])

    # With the store healthy again every partition seals its last records, garbage
    # collection removes the WAL objects they made obsolete, and the orphan sweeps remove
    # what failed, fenced or killed uploads left behind.
    proxy.clear()
    try:
        wait_for(lambda: not orphaned_objects(moto_s3, etcd.url) and not moto_s3.keys("wal/"),
                 timeout=60, what="garbage collection", interval=1.0)
    except AssertionError:
        left = orphaned_objects(moto_s3, etcd.url)
        raise AssertionError(f"{len(left)} orphaned object(s), e.g. {left[:5]}; "
                             f"WAL objects left: {moto_s3.keys('wal/')[:5]}") from None
    assert coordinator_snapshot(etcd.url)["wal"] == []
    check_log(read_everything(bootstrap, topic, partitions), [producer])


def wal_batch_epochs(s3, obj) -> dict[tuple, set[int]]:
    """(topic id, partition) -> the partition leader epochs stamped on the batches of one
    committed WAL object."""
    client = s3.client()
    out: dict[tuple, set[int]] = {}
    for r in obj.ranges:
        body = client.get_object(Bucket=s3.bucket, Key=f"{s3.prefix}/{obj.key}",
                                 Range=f"bytes={r.position}-{r.position + r.length - 1}")["Body"].read()
        batches, valid = scan_batches(body, validate_crc=True)
        assert valid == len(body), f"{obj.key}: corrupt range at {r.position}"
        out.setdefault((r.topic_id, r.partition), set()).update(h.partition_leader_epoch for _, h in batches)
    return out


@pytest.mark.timeout(300)
def test_paused_gateway_is_fenced_and_rejoins(etcd, moto_s3, fault_proxy, gateway_factory, tmp_path):
    partitions = 6
    proxy = fault_proxy  # between gateway 2 and the store only
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, s3=moto_s3,
                        s3_endpoints={2: proxy.endpoint})
    zombie = gws[1]
    bootstrap = bootstrap_of(gws)
    topic = unique_topic("chaos-zombie")
    create_topic(bootstrap, topic, partitions)
    wait_for(lambda: all_lead(bootstrap, topic), what="every gateway to lead")
    producer = ProducerLoad(1, bootstrap, topic, partitions, rate=60,
                            config={"request.timeout.ms": 5000})
    producer.start()
    try:
        wait_for(lambda: producer.ack_count() >= 100, what="the first acknowledgements")
        snap = coordinator_snapshot(etcd.url)
        info = snap["topics"][topic]
        frozen_epochs = {p: st.leader_epoch for p, st in snap["states"][info.topic_id].items()}
        led = {p for p, st in snap["states"][info.topic_id].items() if st.leader == 2}
        assert led, "gateway 2 leads nothing"

        # Gateway 2's next WAL upload hangs in the network; then the process freezes
        # with the upload in flight, and stays frozen until its partitions have moved.
        proxy.set_rules(FaultRule(("PUT",), "hold", key_contains="wal/"))
        wait_for(lambda: proxy.held() >= 1, what="a WAL upload of gateway 2 to hang")
        held_key = next(r.key for r, action in proxy.log if action == "hold")
        held_key = held_key[len(moto_s3.prefix) + 1:]
        # Flushes run one at a time: every object before this one was settled before the
        # freeze, and every later one is flushed after the wake-up.
        held_seq = parse_wal_key(held_key).sequence
        zombie.proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: (lambda m: m if m and all(m[p] not in (2, -1) for p in led)
                                      else None)(try_leaders(gws[0].bootstrap, topic)),
                             what="the controller to move gateway 2's partitions")
            moved_at = time.monotonic()
            wait_for(lambda: {a.partition for a in acks_between([producer], moved_at, 1e18)} >= set(led),
                     timeout=60, what="the new leaders to acknowledge records")
            # The upload completes into the frozen process, which then wakes up and
            # tries to commit the object under its old leader epochs.
            proxy.clear()
            proxy.release()
            wait_for(lambda: held_key in moto_s3.keys("wal/"), what="the held upload to land")
        finally:
            zombie.proc.send_signal(signal.SIGCONT)
        # Its commit is fenced: the object is never committed, and the zombie removes it.
        wait_for(lambda: held_key not in moto_s3.keys("wal/"), timeout=30,
                 what="the fenced WAL object to be removed")
        assert held_key not in {o.key for o in coordinator_snapshot(etcd.url)["wal"]}
        assert zombie.proc.poll() is None, zombie.log_tail()
        # It rejoins as a healthy member: it leads partitions again and they take writes.
        wait_for(lambda: all_lead(bootstrap, topic), timeout=60, what="gateway 2 to lead again")
        back = {p for p, leader in leaders(bootstrap, topic).items() if leader == 2}
        back_at = time.monotonic()
        wait_for(lambda: {a.partition for a in acks_between([producer], back_at, 1e18)} >= back,
                 timeout=60, what="gateway 2 to acknowledge records again")
    except BaseException:
        producer.stop(0)
        raise
    stop_and_check_producers([producer])
    check_log(read_everything(bootstrap, topic, partitions), [producer])

    # Whatever gateway 2 committed after it was frozen carries only leader epochs it was
    # given after it woke up: nothing under the epochs it had been fenced out of.
    snap = coordinator_snapshot(etcd.url)
    later = [o for o in snap["wal"] if o.gateway_id == 2 and o.sequence >= held_seq]
    assert later and held_seq not in {o.sequence for o in later}
    for obj in later:
        for (tid, p), epochs in wal_batch_epochs(moto_s3, obj).items():
            assert tid == info.topic_id
            assert min(epochs) > frozen_epochs[p], \
                f"{obj.key}: partition {p} batches at epochs {epochs}, frozen at {frozen_epochs[p]}"
