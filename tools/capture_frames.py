"""Capture the request frames real Kafka clients send, as codec test fixtures.

    python tools/capture_frames.py [--out tests/fixtures/frames] [--client NAME ...]

For each client (confluent-kafka, kafka-python, aiokafka) a throwaway listener on
127.0.0.1 plays a one-broker cluster just far enough for two short scripts: a producer
that sends one record, and a consumer that subscribes to a group. The listener answers
ApiVersions (every API of our catalog), Metadata (itself as broker 0, leader of
partition 0 of each topic asked for), InitProducerId, Produce, FindCoordinator and the
KIP-714 telemetry APIs (every metric, every half second), all encoded by our own codec, and closes the connection on anything else (so the consumer
stops at JoinGroup). Clients run in child processes, killed if they outstay a timeout.

The first frame of each (API, version) is written to
`<out>/<client>/<api>_request_v<N>.bin`: the frame as it follows the 4-byte size
prefix, i.e. exactly what `decode_request` takes.
"""

from __future__ import annotations

import argparse
import re
import socket
import struct
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from stratalog.gateway.protocol.catalog import APIS, ApiKey
from stratalog.gateway.protocol.frames import decode_request, encode_response, peek_header

ROOT = Path(__file__).resolve().parent.parent

CLIENT_ID = "stratalog-capture"
TOPIC = "capture"
GROUP = "capture-group"
UNSUPPORTED_VERSION = 35
TELEMETRY_INTERVAL_MS = 500
SUPPORTED = {key: (req.vmin, req.vmax) for key, (_, req, _resp) in APIS.items()}

# Placeholders: {addr} the listener, {cid} CLIENT_ID, {topic} TOPIC, {group} GROUP.
PRODUCERS = {
    "confluent_kafka": """
from confluent_kafka import Producer
p = Producer({{"bootstrap.servers": "{addr}", "client.id": "{cid}",
               "broker.address.family": "v4", "linger.ms": 0}})
p.produce("{topic}", key=b"key", value=b"value")
p.flush(15)
""",
    "kafka_python": """
from kafka import KafkaProducer
p = KafkaProducer(bootstrap_servers="{addr}", client_id="{cid}", linger_ms=0)
p.send("{topic}", key=b"key", value=b"value").get(timeout=15)
p.close(timeout=5)
""",
    "aiokafka": """
import asyncio
from aiokafka import AIOKafkaProducer
async def main():
    p = AIOKafkaProducer(bootstrap_servers="{addr}", client_id="{cid}")
    await p.start()
    try:
        await p.send_and_wait("{topic}", b"value", key=b"key")
    finally:
        await p.stop()
asyncio.run(main())
""",
}

CONSUMERS = {
    "confluent_kafka": """
import time
from confluent_kafka import Consumer
c = Consumer({{"bootstrap.servers": "{addr}", "client.id": "{cid}", "group.id": "{group}",
               "broker.address.family": "v4"}})
c.subscribe(["{topic}"])
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    c.poll(0.2)
""",
    "kafka_python": """
import time
from kafka import KafkaConsumer
c = KafkaConsumer("{topic}", bootstrap_servers="{addr}", client_id="{cid}",
                  group_id="{group}")
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    c.poll(timeout_ms=200)
""",
    "aiokafka": """
import asyncio
from aiokafka import AIOKafkaConsumer
async def main():
    c = AIOKafkaConsumer("{topic}", bootstrap_servers="{addr}", client_id="{cid}",
                         group_id="{group}")
    await c.start()
    await c.getone()
try:
    asyncio.run(asyncio.wait_for(main(), 3))
except asyncio.TimeoutError:
    pass
""",
}


def snake(name: str) -> str:
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


class FakeBroker:
    """A loopback listener that records frames and answers just enough to reach Produce."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.frames: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> "FakeBroker":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                frame = _read_frame(conn)
                if frame is None:
                    return
                api_key, version, _ = peek_header(frame)
                with self._lock:
                    self.frames.setdefault((api_key, version), frame)
                reply = self._answer(frame)
                if reply is None:
                    return
                conn.sendall(reply)

    def _answer(self, frame: bytes) -> bytes | None:
        api_key, version, correlation_id = peek_header(frame)
        lo, hi = SUPPORTED[ApiKey.API_VERSIONS]
        if api_key == ApiKey.API_VERSIONS and not lo <= version <= hi:
            # The protocol's fallback: a v0 answer listing our versions, so the client
            # retries with one of them.
            return encode_response(ApiKey.API_VERSIONS, 0, correlation_id, {
                "error_code": UNSUPPORTED_VERSION, "api_keys": _api_keys()})
        req = decode_request(frame, SUPPORTED)
        body = req.body
        if api_key == ApiKey.API_VERSIONS:
            reply = {"api_keys": _api_keys()}
        elif api_key == ApiKey.METADATA:
            reply = self._metadata(body)
        elif api_key == ApiKey.INIT_PRODUCER_ID:
            reply = {"producer_id": 1000, "producer_epoch": 0}
        elif api_key == ApiKey.PRODUCE:
            reply = {"responses": [
                {"name": t.name,
                 "partition_responses": [{"index": p.index} for p in t.partition_data]}
                for t in body.topic_data]}
        elif api_key == ApiKey.FIND_COORDINATOR:
            me = {"node_id": 0, "host": "127.0.0.1", "port": self.port}
            keys = body.coordinator_keys or [body.key]
            reply = {**me, "coordinators": [{"key": k, **me} for k in keys]}
        elif api_key == ApiKey.GET_TELEMETRY_SUBSCRIPTIONS:
            # Every metric, pushed often enough that the short scripts push at least once.
            reply = {"client_instance_id": uuid.uuid5(uuid.NAMESPACE_URL, CLIENT_ID), "subscription_id": 1,
                     "accepted_compression_types": [4, 3, 1, 2], "push_interval_ms": TELEMETRY_INTERVAL_MS,
                     "telemetry_max_bytes": 1024 * 1024, "delta_temporality": False, "requested_metrics": ["*"]}
        elif api_key == ApiKey.PUSH_TELEMETRY:
            reply = {"error_code": 0}
        else:
            return None
        return encode_response(api_key, version, correlation_id, reply)

    def _metadata(self, body) -> dict:
        names = [t.name for t in (body.topics or []) if t.name] or [TOPIC]
        return {
            "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port}],
            "cluster_id": "capture-cluster",
            "controller_id": 0,
            "topics": [{
                "name": n,
                "topic_id": uuid.uuid5(uuid.NAMESPACE_URL, n),
                "partitions": [{"partition_index": 0, "leader_id": 0, "leader_epoch": 0,
                                "replica_nodes": [0], "isr_nodes": [0]}],
            } for n in names],
        }


def _api_keys() -> list[dict]:
    return [{"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(SUPPORTED.items())]


def _read_frame(conn: socket.socket) -> bytes | None:
    head = _read_exactly(conn, 4)
    return None if head is None else _read_exactly(conn, struct.unpack(">i", head)[0])


def _read_exactly(conn: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = conn.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def run_client(script: str, timeout: float) -> dict[tuple[int, int], bytes]:
    """Run one client script against a fresh listener; its frames by (api key, version)."""
    broker = FakeBroker().start()
    code = script.format(addr=f"127.0.0.1:{broker.port}", cid=CLIENT_ID, topic=TOPIC,
                         group=GROUP)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout)
        if proc.returncode != 0:
            sys.stderr.write(f"client exited {proc.returncode}:\n{proc.stderr[-2000:]}\n")
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"client still running after {timeout} s: killed\n")
    finally:
        broker.close()
    return broker.frames


def capture(client: str, out: Path, timeout: float = 30) -> list[Path]:
    """Run the client's producer and consumer scripts; write and return its fixtures."""
    frames = run_client(PRODUCERS[client], timeout)
    for key, frame in run_client(CONSUMERS[client], timeout).items():
        frames.setdefault(key, frame)
    target = out / client
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for (api_key, version), frame in sorted(frames.items()):
        if api_key in APIS:
            path = target / f"{snake(APIS[api_key][0])}_request_v{version}.bin"
            path.write_bytes(frame)
            written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "frames")
    ap.add_argument("--client", action="append", choices=sorted(PRODUCERS))
    args = ap.parse_args()
    for client in args.client or sorted(PRODUCERS):
        for path in capture(client, args.out):
            print(path)


if __name__ == "__main__":
    main()
