"""A hostile environment: a disk that fills up, a store that fails, SIGTERM at any moment,
and a CreateTopics of thousands of partitions. The gateway answers clearly, keeps
serving what it can, ends when told to, and loses nothing it acknowledged."""

from __future__ import annotations

import asyncio
import errno
import json
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, GatewayProcess
from engine_harness import Backends, batch, committed, eventually, read_all, records_of, run
from store_faults import FailingWrites
from stratalog.engine.errors import StorageUnavailable
from stratalog.engine.wal_writer import WalCommitDelayed
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.frames import encode_request
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.infra.processes import http_get

WAL = "wal/"


class FaultyGateway(GatewayProcess):
    """`stratalog serve` whose object store fails writes as `fault_file` says
    (tests/store_faults.py): write "ENOSPC wal/" to fill the disk, delete it to free it."""

    def __init__(self, data_dir: Path, fault_file: Path, settings: dict | None = None):
        super().__init__(data_dir, settings)
        self.fault_file = fault_file

    def command(self) -> list[str]:
        cmd = super().command()
        assert cmd[1:3] == ["-m", "stratalog.infra.cli"]
        return [cmd[0], str(ROOT / "tests" / "store_faults.py"), str(self.fault_file), *cmd[3:]]

    def readiness(self) -> tuple[int, dict] | None:
        got = http_get(f"{self.http_url}/readyz", 5)
        return None if got is None else (got[0], json.loads(got[1]))

    def metric(self, name: str) -> float | None:
        got = http_get(f"{self.http_url}/metrics", 5)
        for line in (got[1].decode() if got else "").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


@pytest.fixture
def faulty_gateway(tmp_path):
    started: list[FaultyGateway] = []

    def make(settings=None) -> FaultyGateway:
        gw = FaultyGateway(tmp_path / "data", tmp_path / "fault", settings)
        started.append(gw)
        return gw.start()

    yield make
    for gw in started:
        gw.stop()


# ---- the engine: a WAL that cannot be written -------------------------------------------

@pytest.mark.unit
def test_a_full_disk_refuses_new_batches_and_keeps_every_appended_one(tmp_path):
    """Past wal.fault.timeout.ms of ENOSPC, new batches are refused before they are
    appended (KAFKA_STORAGE_ERROR), acks=all waiters hear REQUEST_TIMED_OUT (their batches
    may still be committed), and once the disk has room everything appended is committed
    once, in order, with an idempotent producer's retry answered from its original."""
    fault: list = []

    async def body(h):
        await h.create_topic("disk", 1)
        store = FailingWrites(h.objects, lambda: fault[0] if fault else None)
        engine = await h.start_engine(objects=store, wal_fault_timeout_ms=300)
        await h.lead(engine)
        pid = (901, 0)

        def append(seq: int, tag: str):
            return engine.append("disk", 0, batch(1, ts=h.clock.ms, tag=tag, producer=pid, sequence=seq),
                                 now_ms=h.clock.ms)

        await committed(append(0, "a"))
        fault.append((errno.ENOSPC, WAL))
        waiting = append(1, "b")  # appended (and answered, for acks=1) before the fault is known
        with pytest.raises(WalCommitDelayed) as delayed:
            await committed(waiting)
        assert error_code(delayed.value) == ErrorCode.REQUEST_TIMED_OUT
        reason = engine.storage_fault()
        assert reason is not None and "No space left on device" in reason
        with pytest.raises(StorageUnavailable) as refused:
            append(2, "c")
        assert error_code(refused.value) == ErrorCode.KAFKA_STORAGE_ERROR
        assert engine.leader("disk", 0).next_offset == 2, "a refused batch must not be appended"

        fault.clear()
        await eventually(lambda: engine.leader("disk", 0).high_watermark == 2, "the kept batch committed")
        assert engine.storage_fault() is None
        retried = append(1, "b")  # the producer's retry of the timed-out batch
        assert retried.base_offset == 1
        await committed(retried)
        await committed(append(2, "c"))
        values = [r[3][:3] for r in records_of(await read_all(engine, "disk", 0))]
        assert values == [b"a-v", b"b-v", b"c-v"]
        assert [r[0] for r in records_of(await read_all(engine, "disk", 0))] == [0, 1, 2]
        assert store.failed > 0

    run(Backends("embedded+file", tmp_path), body)


@pytest.mark.unit
def test_a_full_data_directory_refuses_the_batch_and_appends_the_next(tmp_path, monkeypatch):
    """The local active segment cannot be written (ENOSPC on the data directory): the batch
    is refused with KAFKA_STORAGE_ERROR and nothing of it is appended; once there is room,
    the next batch takes its offset. (A segment writes the batches it holds before taking a
    new one; with a limit of one byte, before every append.)"""
    import stratalog.tiering.segment as segment

    monkeypatch.setattr(segment.ActiveSegment, "UNWRITTEN_LIMIT", 1)

    async def body(h):
        await h.create_topic("local", 1)
        engine = await h.start_engine()
        await h.lead(engine)
        await committed(engine.append("local", 0, batch(1, ts=h.clock.ms, tag="a"), now_ms=h.clock.ms))
        written = segment.os.pwritev

        def full(fd, views, position):
            segment.os.pwrite(fd, bytes(views[0])[:3], position)  # a partial write, then no room
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(segment.os, "pwritev", full)
        with pytest.raises(StorageUnavailable) as refused:
            engine.append("local", 0, batch(1, ts=h.clock.ms, tag="b"), now_ms=h.clock.ms)
        assert error_code(refused.value) == ErrorCode.KAFKA_STORAGE_ERROR
        monkeypatch.setattr(segment.os, "pwritev", written)
        result = engine.append("local", 0, batch(1, ts=h.clock.ms, tag="c"), now_ms=h.clock.ms)
        assert result.base_offset == 1
        await committed(result)
        assert [r[3][:3] for r in records_of(await read_all(engine, "local", 0))] == [b"a-v", b"c-v"]

    run(Backends("embedded+file", tmp_path), body)


# ---- many partitions at once ----------------------------------------------------------

@pytest.mark.unit
def test_recoveries_of_many_new_partitions_leave_the_event_loop_turns(tmp_path):
    """A creation of thousands of partitions makes thousands of recoveries; on a local store
    one may never suspend, so unbounded they would all run in one turn of the event loop
    and starve every connection. At most RECOVERIES_AT_ONCE finish per turn."""
    from stratalog.engine.leadership import RECOVERIES_AT_ONCE

    async def body(h):
        await h.create_topic("many", 200)
        engine = await h.start_engine()
        led_per_turn: list[int] = []
        done = asyncio.Event()

        async def watch():
            while not done.is_set():
                led_per_turn.append(len(engine.led()))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await h.lead(engine)
        done.set()
        await watcher
        assert len(engine.led()) == 200
        steps = [b - a for a, b in zip(led_per_turn, led_per_turn[1:])]
        assert max(steps) <= RECOVERIES_AT_ONCE, f"{max(steps)} recoveries finished in one turn of the loop"
        assert len(led_per_turn) >= 200 // RECOVERIES_AT_ONCE

    run(Backends("embedded+file", tmp_path), body)


# ---- a real gateway on a full disk --------------------------------------------------------

def _ready_status(gw: FaultyGateway, code: int):
    got = gw.readiness()
    return got if got is not None and got[0] == code else None


def test_a_full_disk_answers_kafka_storage_error_and_loses_nothing_acknowledged(faulty_gateway):
    """ENOSPC on every WAL write: within wal.fault.timeout.ms plus a flush, producers are
    answered KAFKA_STORAGE_ERROR (a plain producer sees it in its delivery reports, long
    before its delivery timeout), /readyz and a metric say why; once the disk has room
    the gateway resumes by itself, and every acknowledged record is there exactly once, in
    order, for an idempotent producer and a plain one."""
    from cluster_fixtures import ProducerLoad, check_log, create_topic, read_everything, wait_for

    gw = faulty_gateway({"wal.fault.timeout.ms": 1000})
    create_topic(gw.bootstrap, "disk", 2)
    idempotent = ProducerLoad(1, gw.bootstrap, "disk", 2, rate=100)
    plain = ProducerLoad(2, gw.bootstrap, "disk", 2, rate=100,
                         config={"enable.idempotence": False, "retries": 0, "message.timeout.ms": 60_000})
    for p in (idempotent, plain):
        p.start()
    wait_for(lambda: idempotent.ack_count() >= 50 and plain.ack_count() >= 50, 60, "acks before the fault")
    assert gw.readiness()[0] == 200 and gw.metric("stratalog_storage_failed") == 0

    gw.fault_file.write_text("ENOSPC wal/")
    began = time.monotonic()
    _, ready = wait_for(lambda: _ready_status(gw, 503), 30, "/readyz to report the fault")
    assert "No space left on device" in ready["reason"], ready
    assert gw.metric("stratalog_storage_failed") == 1
    wait_for(lambda: any("KAFKA_STORAGE_ERROR" in e for _, e in list(plain.failed)), 30,
             "KAFKA_STORAGE_ERROR in the plain producer's delivery reports")
    assert time.monotonic() - began < 45, "not answered before the producer's delivery timeout (60 s)"
    time.sleep(2)  # the fault goes on while both keep producing

    acked = idempotent.ack_count()
    gw.fault_file.unlink()
    wait_for(lambda: _ready_status(gw, 200), 30, "/readyz to recover")
    assert gw.metric("stratalog_storage_failed") == 0
    wait_for(lambda: idempotent.ack_count() >= acked + 100, 60, "acks after the fault")
    assert idempotent.stop() == 0 and plain.stop() == 0
    assert not idempotent.failed and not idempotent.fatal, (idempotent.failed[:3], idempotent.fatal)
    # The plain producer does not retry: each batch refused, or in flight when the fault
    # began, failed with one of these; nothing else.
    kinds = {e.split(",")[0] for _, e in plain.failed}
    assert kinds <= {"KafkaError{code=KAFKA_STORAGE_ERROR", "KafkaError{code=REQUEST_TIMED_OUT"}, kinds
    check_log(read_everything(gw.bootstrap, "disk", 2), [idempotent, plain])
    assert "storage failed" in gw.log_path.read_text() and "storage back" in gw.log_path.read_text()


def test_sigterm_while_the_store_fails_ends_within_the_bound_and_loses_nothing_acknowledged(faulty_gateway):
    from cluster_fixtures import ProducerLoad, check_log, create_topic, read_everything, wait_for

    gw = faulty_gateway({"wal.fault.timeout.ms": 1000, "shutdown.timeout.ms": 3000})
    create_topic(gw.bootstrap, "stop", 2)
    producer = ProducerLoad(1, gw.bootstrap, "stop", 2, rate=100)
    producer.start()
    wait_for(lambda: producer.ack_count() >= 50, 60, "acks before the fault")
    gw.fault_file.write_text("ENOSPC wal/")
    wait_for(lambda: _ready_status(gw, 503), 30, "/readyz to report the fault")

    began = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    gw.proc.wait(60)  # generous: the bound is 3 s
    assert time.monotonic() - began < 30
    assert gw.proc.returncode == 1, "a stop that abandons something says so in its status"
    text = gw.log_path.read_text()
    assert "abandoned after" in text and "not committed" in text, text[-3000:]

    gw.fault_file.unlink()
    gw.start()
    assert producer.stop() == 0 and not producer.failed and not producer.fatal
    check_log(read_everything(gw.bootstrap, "stop", 2), [producer])


def test_sigterm_with_a_hung_disk_ends_within_the_bound(faulty_gateway):
    """A WAL write blocked in the kernel (a hung disk) cannot be cancelled, and the
    interpreter would wait for its thread at exit: the gateway still ends within
    shutdown.timeout.ms plus a few seconds, saying what it abandoned."""
    from confluent_kafka import Producer

    gw = faulty_gateway({"shutdown.timeout.ms": 2000})
    gw.fault_file.write_text("HANG wal/")
    producer = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all", "message.timeout.ms": 5000})
    producer.produce("hung", value=b"never acknowledged")
    producer.poll(3)  # the batch reaches the gateway and its flush hangs
    began = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    gw.proc.wait(60)  # generous: the bound is 2 s, plus 5 s for the interpreter's exit
    assert time.monotonic() - began < 30
    assert gw.proc.returncode == 1
    text = gw.log_path.read_text()
    assert "abandoned after" in text, text[-3000:]
    producer.flush(10)


# ---- a creation of thousands of partitions -------------------------------------------------

class _Pinger(threading.Thread):
    """Sends Metadata (no topics) and ApiVersions, one at a time, and notes when each answer came."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.answers: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
            i = 0
            while not self.halt.is_set():
                api, version, body = (3, 1, {"topics": []}) if i % 2 else (18, 0, {})
                s.sendall(encode_request(api, version, i, body))
                (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
                s.recv(size, socket.MSG_WAITALL)
                self.answers.append(time.monotonic())
                i += 1
                time.sleep(0.02)


def test_a_5000_partition_create_keeps_the_gateway_answering_and_sigterm_ends_one(gateway_factory):
    from confluent_kafka.admin import AdminClient, NewTopic

    gw = gateway_factory({"shutdown.timeout.ms": 5000})
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    pinger = _Pinger(gw.port)
    pinger.start()
    began = time.monotonic()
    admin.create_topics([NewTopic("thousands", 5000, 1)], request_timeout=300)["thousands"].result(300)
    ended = time.monotonic()
    during = [t for t in pinger.answers if began < t < ended]
    times = [began, *during, ended]
    worst = max(b - a for a, b in zip(times, times[1:]))
    assert len(during) >= 3, f"{len(during)} answers during a {ended - began:.1f}s creation (worst gap {worst:.2f}s)"
    md = admin.list_topics("thousands", timeout=30)
    assert len(md.topics["thousands"].partitions) == 5000

    # SIGTERM while another one is under way: the gateway still ends within its bound.
    admin.create_topics([NewTopic("more-thousands", 5000, 1)], request_timeout=300)
    pinger.halt.set()
    time.sleep(1.0)
    stopped = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    gw.proc.wait(60)  # generous: the bound is 5 s
    assert time.monotonic() - stopped < 30
    gw.start()
    assert len(admin.list_topics("thousands", timeout=30).topics["thousands"].partitions) == 5000


def test_max_partitions_bounds_the_whole_cluster(gateway_factory):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    gw = gateway_factory({"max.partitions": 10, "auto.create.topics.enable": False})
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    admin.create_topics([NewTopic("six", 6, 1)])["six"].result(30)
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic("five", 5, 1)])["five"].result(30)
    assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert "max.partitions=10" in refused.value.args[0].str()
    with pytest.raises(KafkaException) as grown:
        admin.create_partitions([NewPartitions("six", 11)])["six"].result(30)
    assert grown.value.args[0].code() == KafkaError.POLICY_VIOLATION
    admin.create_topics([NewTopic("four", 4, 1)])["four"].result(30)  # exactly at the limit
    assert set(admin.list_topics(timeout=30).topics) >= {"six", "four"}
