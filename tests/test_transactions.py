"""Transactions against a real gateway: confluent-kafka's transactional producer, commit and
abort seen through read_committed and read_uncommitted consumers, zombie fencing, the
coordinator's timeout abort, consume-transform-produce through gateway crashes (kill -9
at points inside transactions, the application in txn_pipeline.py), and the
protocol's answers to requests that break the rules (raw frames)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from stratalog.gateway.protocol.catalog import ApiKey
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.tiering.batch import build_batch

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cluster_fixtures import (bootstrap_of, create_topic, etcd, leaders, start_cluster,  # noqa: E402,F401 - etcd is a fixture
                              try_leaders, wait_for)
import raw_client  # noqa: E402
from conftest import GatewayProcess  # noqa: E402


def _topic(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def _create(bootstrap: str, topic: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _producer(bootstrap: str, tid: str, **conf) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **conf})
    p.init_transactions(30)
    return p


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str,
                timeout: float = 30) -> dict[int, list[bytes]]:
    """Every record a fresh consumer with `isolation` reads from offset 0 until it stands
    at each partition's high watermark: partition -> values in offset order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.partition.eof": True,
                  "enable.auto.commit": False})
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        remaining = {p for p in range(partitions) if ends[p] > 0}
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]:
                    remaining.discard(m.partition())
                continue
            out[m.partition()].append(m.value())
        assert not remaining, f"{isolation} consumer stopped short on partitions {remaining}"
        return out
    finally:
        c.close()


# ---- commit and abort ------------------------------------------------------------------------

def test_committed_records_are_read_once_in_order_and_aborted_ones_never(gateway):
    topic = _topic("txn")
    _create(gateway.bootstrap, topic)
    p = _producer(gateway.bootstrap, _topic("tid"))
    expected: dict[int, list[bytes]] = {0: [], 1: []}
    everything: dict[int, list[bytes]] = {0: [], 1: []}
    for round_, commit in enumerate([True, False, True, False, True]):
        p.begin_transaction()
        for i in range(40):
            value = b"r%d-%d" % (round_, i)
            p.produce(topic, value=value, partition=i % 2)
            everything[i % 2].append(value)
            if commit:
                expected[i % 2].append(value)
        if commit:
            p.commit_transaction(30)
        else:
            p.flush(30)  # the aborted records are in the log, not only in the client
            p.abort_transaction(30)
    assert read_values(gateway.bootstrap, topic, 2, "read_committed") == expected
    assert read_values(gateway.bootstrap, topic, 2, "read_uncommitted") == everything


def test_a_consumer_waits_at_the_last_stable_offset_until_the_transaction_ends(gateway):
    topic = _topic("lso")
    _create(gateway.bootstrap, topic, 1)
    p = _producer(gateway.bootstrap, _topic("tid"))
    plain = Producer({"bootstrap.servers": gateway.bootstrap})
    p.begin_transaction()
    p.produce(topic, value=b"in-txn", partition=0)
    p.flush(30)
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(30)
    c = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": _topic("g"),
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        assert c.poll(3) is None  # the open transaction holds back the record after it
        # ListOffsets for read_committed: latest is the last stable offset.
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] == 0
        p.commit_transaction(30)
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        assert got == [b"in-txn", b"after"]
    finally:
        c.close()


# ---- fencing ---------------------------------------------------------------------------------

def test_a_second_producer_with_the_same_id_fences_the_first(gateway):
    topic = _topic("zombie")
    _create(gateway.bootstrap, topic)
    tid = _topic("tid")
    old = _producer(gateway.bootstrap, tid)
    old.begin_transaction()
    old.produce(topic, value=b"zombie-1", partition=0)
    old.flush(30)
    new = _producer(gateway.bootstrap, tid)  # aborts the old one's transaction and fences it
    old.produce(topic, value=b"zombie-2", partition=0)
    old.produce(topic, value=b"zombie-3", partition=1)
    with pytest.raises(KafkaException) as fenced:
        old.commit_transaction(30)
    assert fenced.value.args[0].fatal()
    new.begin_transaction()
    new.produce(topic, value=b"live", partition=1)
    new.commit_transaction(30)
    committed = read_values(gateway.bootstrap, topic, 2, "read_committed")
    assert committed == {0: [], 1: [b"live"]}


def test_a_transaction_open_past_its_timeout_is_aborted(gateway_factory):
    gw = gateway_factory(settings={"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = _topic("timeout")
    _create(gw.bootstrap, topic, 1)
    stuck = _producer(gw.bootstrap, _topic("tid"), **{"transaction.timeout.ms": 2000})
    began = time.monotonic()  # the transaction begins after this (its first AddPartitionsToTxn)
    stuck.begin_transaction()
    stuck.produce(topic, value=b"abandoned", partition=0)
    stuck.flush(30)
    plain = Producer({"bootstrap.servers": gw.bootstrap})
    plain.produce(topic, value=b"later", partition=0)
    plain.flush(30)
    c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": _topic("g"),
                  "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        got = None
        while got is None and time.monotonic() - began < 30:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got = m.value()
        # Not before the timeout (the transaction could still have committed), and never
        # the abandoned record.
        assert got == b"later"
        assert time.monotonic() - began >= 2.0
    finally:
        c.close()
    with pytest.raises(KafkaException):
        stuck.commit_transaction(10)


# ---- consume, transform, produce -------------------------------------------------------------

PIPELINE = Path(__file__).with_name("txn_pipeline.py")


class Supervised:
    """The pipeline application (txn_pipeline.py) in a child process, restarted when it
    makes no progress for STALL_S: librdkafka's send_offsets_to_transaction can block for
    ever once the group coordinator restarted (confluentinc/librdkafka#5456, #5511), and
    an operator's supervisor restarts such an application. A restarted instance with the
    same transactional id fences the stuck one, so exactly-once must hold through it."""

    STALL_S = 10.0

    def __init__(self, *args: str):
        self.args = args
        self.commits = 0
        self.restarts = 0
        self.done = threading.Event()
        self._last_progress = time.monotonic()
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PIPELINE), *self.args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._follow, args=(self.proc,), daemon=True).start()

    def _follow(self, proc) -> None:
        for line in proc.stdout:
            if line.startswith("commit"):
                self.commits += 1
                self._last_progress = time.monotonic()
            elif line.startswith("done"):
                self.done.set()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.done.is_set() and time.monotonic() < deadline:
            if time.monotonic() - self._last_progress > self.STALL_S:
                self.proc.kill()
                self.proc.wait()
                self.restarts += 1
                self._last_progress = time.monotonic()
                self._start()
            time.sleep(0.2)
        return self.done.is_set()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.mark.chaos
def test_consume_transform_produce_is_exactly_once_through_gateway_crashes(tmp_path):
    gw = GatewayProcess(tmp_path / "data", {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 500}).start()
    app = None
    try:
        source, sink, group = _topic("in"), _topic("out"), _topic("ctp-group")
        _create(gw.bootstrap, source)
        _create(gw.bootstrap, sink)
        total = 1200
        p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
        for i in range(total):
            p.produce(source, key=b"%d" % i, value=b"rec-%05d" % i, partition=i % 2)
        assert p.flush(30) == 0
        app = Supervised(gw.bootstrap, source, sink, group, str(total), _topic("ctp"))
        rng = random.Random(7)
        for at in (8, 25, 45):  # transactions committed before each crash
            deadline = time.monotonic() + 120
            while app.commits < at and time.monotonic() < deadline:
                app.wait(0.2)
            time.sleep(rng.uniform(0, 0.3))  # somewhere inside the next transaction
            assert not app.done.is_set()
            gw.kill9()
            gw.start(timeout=60)
        assert app.wait(150), "the pipeline did not finish"
        source_values = read_values(gw.bootstrap, source, 2, "read_uncommitted")
        output = read_values(gw.bootstrap, sink, 2, "read_committed")
        assert output == {part: [v.upper() for v in values] for part, values in source_values.items()}
        c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": group})
        committed = c.committed([TopicPartition(source, part) for part in range(2)], 10)
        c.close()
        assert {tp.partition: tp.offset for tp in committed} == {0: total // 2, 1: total // 2}
    finally:
        if app is not None:
            app.stop()
        gw.stop()


# ---- requests that break the rules (raw frames) ----------------------------------------------

class Raw(raw_client.Raw):
    """One connection speaking the transactional requests by hand."""

    def __init__(self, gw):
        super().__init__(f"127.0.0.1:{gw.port}")

    def init(self, tid: str, timeout_ms: int = 60000, pid: int = -1, epoch: int = -1):
        return self.call(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": tid, "transaction_timeout_ms": timeout_ms,
                                                       "producer_id": pid, "producer_epoch": epoch})

    def add_partitions(self, tid: str, pid: int, epoch: int, topic: str, partitions, version: int = 3):
        resp = self.call(ApiKey.ADD_PARTITIONS_TO_TXN, version, {
            "v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": list(partitions)}]})
        return {r.partition_index: r.partition_error_code
                for t in resp.results_by_topic_v3_and_below for r in t.results_by_partition}

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> int:
        return self.call(ApiKey.END_TXN, 3, {"transactional_id": tid, "producer_id": pid,
                                             "producer_epoch": epoch, "committed": commit}).error_code

    def produce(self, topic: str, partition: int, batch: bytes, tid: str | None) -> int:
        resp = self.call(ApiKey.PRODUCE, 9, {
            "transactional_id": tid, "acks": -1, "timeout_ms": 10000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]})
        return resp.responses[0].partition_responses[0].error_code

    def high_watermark(self, topic: str, partition: int) -> int:
        resp = self.call(ApiKey.LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                             "timestamp": -1}]}]})
        return resp.topics[0].partitions[0].offset


def _txn_batch(pid: int, epoch: int, seq: int = 0, *, control: bool = False) -> bytes:
    return build_batch([(None, b"x", [])], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       is_transactional=True, is_control=control)


def test_rule_breaking_transactional_requests_get_kafkas_errors_and_write_nothing(gateway):
    topic = _topic("rules")
    _create(gateway.bootstrap, topic)
    raw = Raw(gateway)
    tid = _topic("tid")
    assert raw.init(tid, timeout_ms=10**9).error_code == E.INVALID_TRANSACTION_TIMEOUT
    got = raw.init(tid)
    assert got.error_code == E.NONE
    pid, epoch = got.producer_id, got.producer_epoch

    # Data before AddPartitionsToTxn, and from a producer without a transactional id.
    assert raw.produce(topic, 0, _txn_batch(pid, epoch), tid) == E.INVALID_TXN_STATE
    assert raw.produce(topic, 0, _txn_batch(pid, epoch), None) == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # A marker written by a client.
    assert raw.produce(topic, 0, _txn_batch(pid, epoch, -1, control=True), None) == E.INVALID_RECORD
    # EndTxn with nothing added.
    assert raw.end(tid, pid, epoch, True) == E.INVALID_TXN_STATE
    # Wrong producer id, wrong epoch (old clients are told INVALID_PRODUCER_EPOCH).
    assert raw.add_partitions(tid, pid + 1, epoch, topic, [0]) == {0: E.INVALID_PRODUCER_ID_MAPPING}
    assert raw.add_partitions(tid, pid, epoch + 1, topic, [0]) == {0: E.PRODUCER_FENCED}
    assert raw.add_partitions(tid, pid, epoch + 1, topic, [0], version=1) == {0: E.INVALID_PRODUCER_EPOCH}
    # An unknown partition fails the whole request.
    assert raw.add_partitions(tid, pid, epoch, topic, [0, 7]) == {0: E.OPERATION_NOT_ATTEMPTED,
                                                                  7: E.UNKNOWN_TOPIC_OR_PARTITION}
    assert raw.high_watermark(topic, 0) == 0 and raw.high_watermark(topic, 1) == 0

    # A zombie: fenced by a new InitProducerId, its writes to a partition it never touched
    # are refused too (the partition learns of the fence from the coordinator).
    assert raw.add_partitions(tid, pid, epoch, topic, [0]) == {0: E.NONE}
    assert raw.produce(topic, 0, _txn_batch(pid, epoch), tid) == E.NONE
    fenced = raw.init(tid)
    assert fenced.error_code == E.CONCURRENT_TRANSACTIONS  # aborting the zombie's transaction
    deadline = time.monotonic() + 20
    while (again := raw.init(tid)).error_code == E.CONCURRENT_TRANSACTIONS and time.monotonic() < deadline:
        time.sleep(0.1)
    assert again.error_code == E.NONE and again.producer_epoch > epoch
    assert raw.produce(topic, 1, _txn_batch(pid, epoch), tid) == E.INVALID_PRODUCER_EPOCH
    assert raw.produce(topic, 0, _txn_batch(pid, epoch, 1), tid) == E.INVALID_PRODUCER_EPOCH
    assert raw.end(tid, pid, epoch, True) == E.PRODUCER_FENCED
    assert raw.high_watermark(topic, 1) == 0
    assert read_values(gateway.bootstrap, topic, 2, "read_committed") == {0: [], 1: []}


def test_transactions_and_producers_are_described(gateway):
    topic = _topic("describe")
    _create(gateway.bootstrap, topic)
    tid = _topic("tid")
    p = _producer(gateway.bootstrap, tid, **{"transaction.timeout.ms": 45000})
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=1)
    p.flush(30)
    raw = Raw(gateway)
    [state] = raw.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [tid]}).transaction_states
    assert (state.error_code, state.transaction_state, state.transaction_timeout_ms) == (E.NONE, "Ongoing", 45000)
    assert [(t.topic, list(t.partitions)) for t in state.topics] == [(topic, [1])]
    listed = raw.call(ApiKey.LIST_TRANSACTIONS, 1, {"state_filters": ["Ongoing"], "producer_id_filters": [],
                                                    "duration_filter": -1})
    assert (tid, state.producer_id) in {(t.transactional_id, t.producer_id) for t in listed.transaction_states}
    producers = raw.call(ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": topic, "partition_indexes": [1]}]})
    [active] = producers.topics[0].partitions[0].active_producers
    assert (active.producer_id, active.current_txn_start_offset) == (state.producer_id, 0)
    p.commit_transaction(30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        [state] = raw.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [tid]}).transaction_states
        if state.transaction_state == "CompleteCommit":
            break
        time.sleep(0.1)
    assert state.transaction_state == "CompleteCommit"
    [unknown] = raw.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["never-used"]}).transaction_states
    assert unknown.error_code == E.TRANSACTIONAL_ID_NOT_FOUND


def test_an_idle_transactional_id_is_forgotten_and_its_producer_goes_on(gateway_factory):
    """transactional.id.expiration.ms: an id whose last transaction ended that long ago is
    forgotten (DescribeTransactions no longer knows it); one with a transaction open is
    kept. The forgotten id's producer, coming back, gets a fresh producer id and its
    next transaction commits."""
    gw = gateway_factory(settings={"transactional.id.expiration.ms": 1500,
                                   "transaction.remove.expired.transaction.cleanup.interval.ms": 200})
    topic = _topic("expire")
    _create(gw.bootstrap, topic)
    idle_tid, open_tid = _topic("idle"), _topic("open")
    idle = _producer(gw.bootstrap, idle_tid)
    idle.begin_transaction()
    idle.produce(topic, value=b"first", partition=0)
    idle.commit_transaction(30)
    busy = _producer(gw.bootstrap, open_tid, **{"transaction.timeout.ms": 60_000})
    busy.begin_transaction()
    busy.produce(topic, value=b"open", partition=1)
    busy.flush(30)
    raw = Raw(gw)

    def described(tid: str):
        [state] = raw.call(ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [tid]}).transaction_states
        return state
    first_pid = described(idle_tid).producer_id
    deadline = time.monotonic() + 30
    while described(idle_tid).error_code != E.TRANSACTIONAL_ID_NOT_FOUND and time.monotonic() < deadline:
        time.sleep(0.2)
    assert described(idle_tid).error_code == E.TRANSACTIONAL_ID_NOT_FOUND
    kept = described(open_tid)
    assert (kept.error_code, kept.transaction_state) == (E.NONE, "Ongoing")

    # The forgotten id's producer starts a new transaction as if nothing happened.
    idle.begin_transaction()
    idle.produce(topic, value=b"second", partition=0)
    try:
        idle.commit_transaction(30)
    except KafkaException as e:
        # librdkafka recovers from the unknown producer id by aborting and re-initialising
        # (KIP-360); the transaction is then retried, as an application does.
        assert e.args[0].txn_requires_abort(), e
        idle.abort_transaction(30)
        idle.begin_transaction()
        idle.produce(topic, value=b"second", partition=0)
        idle.commit_transaction(30)
    assert described(idle_tid).producer_id != first_pid
    busy.commit_transaction(30)
    assert read_values(gw.bootstrap, topic, 2, "read_committed") == {0: [b"first", b"second"], 1: [b"open"]}


# ---- a cluster losing the gateway that decided --------------------------------------------

def _coordinator_of(gw, tid: str) -> int:
    resp = Raw(gw).call(ApiKey.FIND_COORDINATOR, 3, {"key": tid, "key_type": 1})
    assert resp.error_code == E.NONE
    return resp.node_id


@pytest.mark.chaos
def test_a_decided_transaction_is_completed_by_the_other_gateways(gateway_factory, etcd, tmp_path):
    """The coordinator answers EndTxn and is killed while the leaders of the transaction's
    other partitions are frozen; once they run again (and the dead gateway's partitions
    have moved), every marker is written: the transaction commits, nothing lost or doubled."""
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3)
    bootstrap = bootstrap_of(gws)
    topic = _topic("decided")
    create_topic(bootstrap, topic, 3)
    wait_for(lambda: sorted(leaders(bootstrap, topic).values()) == [1, 2, 3], what="a leader on each gateway")
    tid = next(t for t in (_topic("tid") for _ in range(100)) if _coordinator_of(gws[0], t) == 1)
    p = _producer(bootstrap, tid)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=b"first-%02d" % i, partition=i % 3)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=b"second-%02d" % i, partition=i % 3)
    p.flush(30)
    others = [g for g in gws if g is not gws[0]]
    for g in others:
        g.proc.send_signal(signal.SIGSTOP)
    try:
        p.commit_transaction(30)  # decided by gateway 1, which writes only its own marker
    finally:
        gws[0].kill9()
        for g in others:
            g.proc.send_signal(signal.SIGCONT)
    live = bootstrap_of(others)
    wait_for(lambda: -1 not in try_leaders(live, topic).values() and 1 not in try_leaders(live, topic).values()
             and len(try_leaders(live, topic)) == 3, timeout=60, what="the dead gateway's partition to move")
    expected = {part: [b"first-%02d" % i for i in range(part, 30, 3)] + [b"second-%02d" % i for i in range(part, 30, 3)]
                for part in range(3)}
    seen: list = []

    def complete():
        try:
            seen.append(read_values(live, topic, 3, "read_committed", timeout=20))
        except (KafkaException, AssertionError):
            return None  # leadership or the markers still on their way
        return seen[-1] == expected

    wait_for(complete, timeout=90, what="every marker of the decided transaction")
