"""Malformed, truncated, oversized and garbage frames, and unknown APIs: the gateway closes
that connection or answers with an error code, and keeps serving everyone else."""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from stratalog.gateway.protocol.frames import decode_response, encode_request

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402


def _connect(gw) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    return s


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, socket.timeout):
        return True


def _round_trip_still_works(gw):
    topic = f"alive-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
    p.produce(topic, value=b"still here")
    assert p.flush(20) == 0
    c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "x"})
    c.assign([TopicPartition(topic, 0, 0)])
    for _ in range(40):
        m = c.poll(0.5)
        if m is not None and not m.error():
            assert m.value() == b"still here"
            break
    else:
        raise AssertionError("no record back")
    c.close()
    assert gw.proc.poll() is None


def _recv_frame(s: socket.socket) -> bytes:
    head = s.recv(4, socket.MSG_WAITALL)
    (n,) = struct.unpack(">i", head)
    return s.recv(n, socket.MSG_WAITALL)


BAD_FRAMES = {
    "negative-size": struct.pack(">i", -1),
    "oversized": struct.pack(">i", 200 * 1024 * 1024) + b"\x00" * 100,
    "too-short-for-header": struct.pack(">i", 3) + b"\x00\x03\x00",
    "unknown-api-key": struct.pack(">i", 12) + struct.pack(">hhi", 999, 0, 7) + b"\x00\x00",
    "unsupported-version": struct.pack(">i", 12) + struct.pack(">hhi", 3, 99, 7) + b"\x00\x00",
    # client id claims 32767 bytes, 10 follow
    "garbage-body": struct.pack(">i", 20) + struct.pack(">hhi", 3, 1, 7) + b"\x7f\xff" + b"\x00" * 10,
    "truncated-metadata": encode_request(3, 1, 7, {"topics": [{"name": "x" * 50}]})[:-10],
}


def test_bad_frames_close_only_their_connection(gateway):
    for name, frame in BAD_FRAMES.items():
        s = _connect(gateway)
        if name == "truncated-metadata":
            # Claim the full size but send less, then half-close: the read fails cleanly.
            s.sendall(struct.pack(">i", len(frame) + 6) + frame[4:])
            s.shutdown(socket.SHUT_WR)
        else:
            s.sendall(frame)
        assert _closed(s), name
        s.close()
    _round_trip_still_works(gateway)


def test_unsupported_api_versions_version_gets_v0_error(gateway):
    s = _connect(gateway)
    s.sendall(struct.pack(">i", 10) + struct.pack(">hhi", 18, 99, 42) + b"\x00\x00")
    frame = _recv_frame(s)
    corr, body = decode_response(18, 0, frame)
    assert corr == 42
    assert body.error_code == 35  # UNSUPPORTED_VERSION
    assert any(k.api_key == 0 for k in body.api_keys)
    s.close()


def test_pipelined_requests_are_answered_in_order(gateway):
    s = _connect(gateway)
    frames = b"".join(encode_request(18 if i % 2 else 3, 3 if i % 2 else 1, i,
                                     {} if i % 2 else {"topics": []}) for i in range(20))
    s.sendall(frames)
    for i in range(20):
        corr, _ = decode_response(18 if i % 2 else 3, 3 if i % 2 else 1, _recv_frame(s))
        assert corr == i
    s.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.binary(min_size=0, max_size=300), key=st.sampled_from([0, 1, 3, 8, 11, 18, 19, 32]),
       version=st.integers(0, 12))
def test_fuzzed_frames_never_kill_the_gateway(gateway, body, key, version):
    s = _connect(gateway)
    s.settimeout(1)
    payload = struct.pack(">hhi", key, version, 1) + body
    s.sendall(struct.pack(">i", len(payload)) + payload)
    try:
        s.recv(65536)
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    assert gateway.proc.poll() is None


def test_produce_v0_is_refused_although_advertised(gateway):
    """Produce v0 is listed in ApiVersions only so that old librdkafka (kcat) enables
    compression; a v0 request itself gets the connection closed."""
    s = _connect(gateway)
    s.sendall(encode_request(18, 3, 1, {}))
    _, body = decode_response(18, 3, _recv_frame(s))
    produce = next(k for k in body.api_keys if k.api_key == 0)
    assert produce.min_version == 0
    s.sendall(encode_request(0, 0, 2, {"acks": 1, "timeout_ms": 1000, "topic_data": []}))
    assert _closed(s)
    s.close()


def test_a_decompression_bomb_to_a_compacted_topic_is_refused(gateway):
    """A compacted topic is the one produce path that decompresses records (to check their
    keys): ~100 KiB of zstd that inflates to 1 GiB gets CORRUPT_MESSAGE, not an OOM kill."""
    import crc32c
    import zstandard
    from confluent_kafka.admin import AdminClient, NewTopic

    from stratalog.tiering import compression
    from stratalog.tiering.batch import build_batch

    topic = f"bomb-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(15)
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = bytes(16 * 1024 * 1024)
    bomb = b"".join(stream.compress(zeros) for _ in range(64)) + stream.flush()
    # A real batch header (CRC over the bomb) around a records section that is the bomb.
    header = bytearray(build_batch([(b"k", b"v", [])], timestamp_ms=1000, compression=compression.ZSTD)[:61])
    struct.pack_into(">i", header, 8, 49 + len(bomb))
    batch = header + bomb
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    s = _connect(gateway)
    s.sendall(encode_request(0, 7, 5, {"acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": bytes(batch)}]}]}))
    _, body = decode_response(0, 7, _recv_frame(s))
    s.close()
    part = body.responses[0].partition_responses[0]
    assert part.error_code == 2  # CORRUPT_MESSAGE
    status = open(f"/proc/{gateway.proc.pid}/status").read()
    peak_mib = int(status.split("VmHWM:")[1].split()[0]) // 1024
    assert peak_mib < 512, f"the gateway inflated the bomb: peak RSS {peak_mib} MiB"
    _round_trip_still_works(gateway)


def test_bad_batches_get_their_own_error_code_per_partition(gateway):
    """A produce request whose batches are of an old message format, damaged or whole:
    each partition gets its own answer (UNSUPPORTED_FOR_MESSAGE_FORMAT, CORRUPT_MESSAGE,
    appended), with the headers parsed once for the request's checks and the append."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from stratalog.tiering.batch import build_batch

    topic = f"formats-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(15)
    good = build_batch([(b"k", b"v", [])] * 3, timestamp_ms=int(time.time() * 1000))
    old_format = bytearray(good)
    old_format[16] = 1  # magic 1
    damaged = bytearray(good)
    damaged[-1] ^= 0xFF  # the CRC no longer matches
    s = _connect(gateway)
    s.sendall(encode_request(0, 9, 5, {"acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": bytes(old_format)},
                                           {"index": 1, "records": bytes(damaged)},
                                           {"index": 2, "records": good}]}]}))
    _, body = decode_response(0, 9, _recv_frame(s))
    s.close()
    parts = {p.index: p for p in body.responses[0].partition_responses}
    assert parts[0].error_code == 43  # UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert parts[1].error_code == 2 and "CRC mismatch" in parts[1].error_message  # CORRUPT_MESSAGE
    assert (parts[2].error_code, parts[2].base_offset) == (0, 0)
    c = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "formats"})
    c.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append((m.partition(), m.offset()))
    c.close()
    assert sorted(got) == [(2, 0), (2, 1), (2, 2)]


def test_a_damaged_sealed_segment_fails_only_its_partition(gateway_factory):
    """A sealed .log damaged in the object store is answered CORRUPT_MESSAGE for its
    partition, never served as records; the other partition and the gateway keep serving."""
    import time
    from pathlib import Path

    from confluent_kafka.admin import AdminClient, NewTopic

    gw = gateway_factory(settings={"log.roll.ms": 300})
    topic = f"damaged-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
    for i in range(40):
        p.produce(topic, value=f"{i:04d}".encode() * 50, partition=i % 2)
    assert p.flush(15) == 0
    objects = Path(gw.data_dir) / "objects" / "topics"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        logs = {int(f.parent.name): f for f in objects.glob(f"{topic}-*/*/*.log")}
        local = sum(f.stat().st_size for f in (Path(gw.data_dir) / "logs").glob(f"{topic}-*/*.log"))
        if len(logs) == 2 and local == 0:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"both partitions never sealed: {sorted(objects.rglob('*.log'))}")
    data = bytearray(logs[0].read_bytes())
    data[100] ^= 0xFF  # in the first batch: a damaged batch after intact ones ends the read before it
    logs[0].write_bytes(bytes(data))

    s = _connect(gw)
    s.sendall(encode_request(1, 11, 1, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [
            {"partition": n, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
             "partition_max_bytes": 1 << 20} for n in (0, 1)]}]}))
    _, body = decode_response(1, 11, _recv_frame(s))
    s.close()
    parts = {r.partition_index: r for r in body.responses[0].partitions}
    assert parts[0].error_code == 2 and not parts[0].records  # CORRUPT_MESSAGE
    assert parts[1].error_code == 0 and parts[1].records
    _round_trip_still_works(gw)


def test_a_pending_long_poll_does_not_hold_up_the_stop(gateway):
    """SIGTERM while a client waits on a 60 s long poll: the gateway stops at once."""
    topic = f"idle-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gateway.bootstrap})
    p.produce(topic, value=b"x")
    assert p.flush(20) == 0
    s = _connect(gateway)
    s.sendall(encode_request(1, 4, 1, {
        "replica_id": -1, "max_wait_ms": 60000, "min_bytes": 1 << 30, "max_bytes": 1 << 20,
        "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": 1, "partition_max_bytes": 1 << 20}]}]}))
    time.sleep(0.5)  # the fetch is waiting
    began = time.monotonic()
    gateway.stop()
    assert time.monotonic() - began < 10
    s.close()


def test_a_request_behind_a_long_poll_is_answered_without_waiting_for_it(gateway):
    """A Metadata request sent behind a 20 s fetch long poll on the same connection: the
    fetch answers at once (empty), then the Metadata, both long before the 20 s."""
    from raw_client import Raw

    from stratalog.gateway.protocol.catalog import ApiKey

    topic = f"idle-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gateway.bootstrap})
    p.produce(topic, value=b"x")
    assert p.flush(20) == 0
    raw = Raw(gateway.bootstrap)
    try:
        raw.send(ApiKey.FETCH, 4, {
            "replica_id": -1, "max_wait_ms": 20000, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 1, "partition_max_bytes": 1 << 20}]}]})
        time.sleep(0.5)  # the fetch is waiting
        began = time.monotonic()
        raw.send(ApiKey.METADATA, 1, {"topics": [{"name": topic}]})
        fetched = raw.receive(ApiKey.FETCH, 4)
        meta = raw.receive(ApiKey.METADATA, 1)
        assert time.monotonic() - began < 10
        assert fetched.responses[0].partitions[0].error_code == 0
        assert not fetched.responses[0].partitions[0].records
        assert [t.name for t in meta.topics] == [topic]
    finally:
        raw.close()


def _fetch_all(gw, topic: str, copies: int, max_bytes: int):
    s = _connect(gw)
    try:
        s.sendall(encode_request(1, 11, 1, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": max_bytes,
                 "current_leader_epoch": -1, "log_start_offset": -1}] * copies}],
            "forgotten_topics_data": []}))
        _, resp = decode_response(1, 11, _recv_frame(s))
        return resp.responses[0].partitions
    finally:
        s.close()


def test_a_fetch_is_bounded_by_fetch_max_bytes_and_answers_a_partition_once(gateway_factory):
    gw = gateway_factory(settings={"fetch.max.bytes": 64 * 1024})
    topic = f"amplify-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gw.bootstrap, "linger.ms": 0, "batch.size": 2048})
    for _ in range(200):
        p.produce(topic, value=b"x" * 1000)
        p.poll(0)
    assert p.flush(20) == 0
    parts = _fetch_all(gw, topic, copies=100, max_bytes=50 << 20)
    assert len(parts) == 1  # not 100 copies
    assert 0 < len(parts[0].records) <= 64 * 1024 + 4096  # the cap, plus at most one batch


@pytest.mark.unit
@pytest.mark.parametrize("name, value", [("segment.bytes", "99999999999999"), ("segment.bytes", "13"),
                                         ("max.message.bytes", str(2**31)), ("retention.ms", str(2**63)),
                                         ("segment.ms", "soon")])
def test_config_values_are_checked_like_kafkas_configdef(name, value):
    from stratalog.gateway.config import ConfigError, parse_value

    with pytest.raises(ConfigError, match=name):
        parse_value(name, value)


@pytest.mark.unit
def test_a_stored_topic_config_an_older_release_accepted_still_reads():
    from stratalog.gateway.config import BrokerConfig

    # 0.1.0 took any 64-bit segment.bytes; the topic must keep working after an upgrade.
    assert BrokerConfig().topic_config({"segment.bytes": "99999999999999"}, "segment.bytes") == 99999999999999


def test_a_topic_config_out_of_range_is_refused_with_invalid_config(gateway):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    topic = f"ranged-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ck.KafkaException) as refused:
        admin.create_topics([NewTopic(topic, 1, 1, config={"segment.bytes": "99999999999999"})])[topic].result(15)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert "2147483647" in refused.value.args[0].str()


def test_a_create_topics_past_the_partition_limit_is_refused_at_once(gateway):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    huge, small = f"huge-{uuid.uuid4().hex[:6]}", f"small-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    futures = admin.create_topics([NewTopic(huge, 100_000, 1), NewTopic(small, 2, 1)])
    with pytest.raises(ck.KafkaException) as refused:
        futures[huge].result(15)
    assert refused.value.args[0].code() == ck.KafkaError.POLICY_VIOLATION
    assert "10000" in refused.value.args[0].str()
    futures[small].result(15)  # the rest of the request is still served
    assert time.monotonic() - began < 5
    _round_trip_still_works(gateway)


def _answers(gw) -> bool:
    """Whether a new connection gets an ApiVersions answer."""
    try:
        s = _connect(gw)
        s.sendall(encode_request(18, 0, 1, {}))
        return bool(_recv_frame(s))
    except (OSError, struct.error):
        return False


def test_connection_quotas_and_idle_connections_are_applied(gateway_factory):
    gw = gateway_factory(settings={"max.connections.per.ip": 3, "connections.max.idle.ms": 1000})
    held = [_connect(gw) for _ in range(3)]
    for s in held:
        s.sendall(encode_request(18, 0, 1, {}))
        assert _recv_frame(s)
    assert not _answers(gw)  # a fourth from 127.0.0.1 is closed at once
    time.sleep(2.5)  # the three are idle: closed
    assert all(_closed_by_peer(s) for s in held)
    assert _answers(gw)
    status, text = _metrics(gw)
    assert 'stratalog_connections_refused_total{limit="max.connections.per.ip"} 1.0' in text
    _round_trip_still_works(gw)


def test_a_client_waiting_for_an_answer_is_not_idle(gateway_factory):
    gw = gateway_factory(settings={"connections.max.idle.ms": 500})
    topic = f"slow-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gw.bootstrap})
    p.produce(topic, value=b"x")
    assert p.flush(20) == 0
    s = _connect(gw)
    s.sendall(encode_request(1, 4, 1, {
        "replica_id": -1, "max_wait_ms": 2000, "min_bytes": 1 << 30, "max_bytes": 1 << 20,
        "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": 1, "partition_max_bytes": 1 << 20}]}]}))
    _, resp = decode_response(1, 4, _recv_frame(s))  # answered after its 2 s long poll
    assert resp.responses[0].partitions[0].error_code == 0


def _metrics(gw) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(gw.http_url + "/metrics", timeout=10) as r:
        return r.status, r.read().decode()


@pytest.mark.unit
def test_connection_limits_count_per_ip_with_overrides_and_the_creation_rate():
    from stratalog.gateway.config import BrokerConfig, ConfigError
    from stratalog.gateway.connection_limits import ConnectionLimits, parse_overrides

    now = [0.0]
    limits = ConnectionLimits(BrokerConfig({
        "max.connections.per.ip": 1, "max.connections.per.ip.overrides": "10.0.0.9:2",
        "max.connection.creation.rate": 4}), clock=lambda: now[0])
    assert limits.admit("10.0.0.1") is None
    assert limits.admit("10.0.0.1") == "max.connections.per.ip"
    assert limits.admit("10.0.0.9") is None and limits.admit("10.0.0.9") is None
    assert limits.admit("10.0.0.2") is None
    assert limits.admit("10.0.0.3") == "max.connection.creation.rate"  # 4 in this second
    now[0] = 1.5
    limits.release("10.0.0.1")
    assert limits.admit("10.0.0.1") is None and limits.total == 4
    with pytest.raises(ConfigError, match="host:count"):
        parse_overrides("10.0.0.1")


def _closed_by_peer(s: socket.socket) -> bool:
    """True if the gateway closed the connection; False if it is still open (no wait)."""
    s.setblocking(False)
    try:
        return s.recv(1 << 20) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_half_sent_large_frames_hold_bounded_memory_and_are_closed(gateway_factory):
    """40 connections each announce a 90 MiB request and send 4 MiB of it: the gateway reads
    at most queued.max.request.bytes of them, keeps serving a real client, and closes the
    stalled frames after request.read.timeout.ms."""
    gw = gateway_factory(settings={"queued.max.request.bytes": 16 << 20, "request.read.timeout.ms": 4000})
    _round_trip_still_works(gw)
    before = _rss_mb(gw.proc.pid)
    chunk = b"\0" * (4 << 20)
    stalled = []
    for _ in range(40):
        s = _connect(gw)
        s.settimeout(0.5)
        try:
            s.sendall(struct.pack(">i", 90 << 20) + chunk)
        except socket.timeout:
            pass  # the gateway is not reading this one: the kernel buffers what it can
        stalled.append(s)
    time.sleep(1.0)
    _round_trip_still_works(gw)
    grown = _rss_mb(gw.proc.pid) - before
    assert grown < 16 + 40 * 0.5 + 24, f"RSS grew {grown:.0f} MiB"
    time.sleep(4.5)
    assert any(_closed_by_peer(s) for s in stalled[:5])  # the one read from: closed at its deadline
    _round_trip_still_works(gw)
    for s in stalled:
        s.close()
