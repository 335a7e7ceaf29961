"""A Kafka responder that stores nothing: the ceiling a benchmark client reaches.

It answers ApiVersions, Metadata (itself as the only broker, leading every partition),
CreateTopics, InitProducerId, Produce (every batch acknowledged at once, offsets counted),
ListOffsets and Fetch (synthetic 1 KiB records up to the offsets produced), with the
project's own protocol codec. What a client does against it is what the client, the
codec and the loopback socket can do together; a broker's figure as a fraction of it says
how much the broker itself costs.

    .venv/bin/python bench/discard.py --port 9092
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import uuid

from stratalog.gateway.protocol.frames import decode_request, encode_response_parts
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.handlers.registry import ApiKey
from stratalog.tiering.batch import BatchHeader, build_batch, patch_batch

NODE = 1
RECORD = 1024
FETCH_BATCH_RECORDS = 64
DEFAULT_PARTITIONS = 8
# The versions answered; the codec knows every one of them.
VERSIONS = {ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (1, 12), ApiKey.CREATE_TOPICS: (2, 7),
            ApiKey.INIT_PRODUCER_ID: (0, 4), ApiKey.PRODUCE: (3, 9), ApiKey.LIST_OFFSETS: (1, 7),
            ApiKey.FETCH: (4, 12)}


class Discard:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.topics: dict[str, tuple[uuid.UUID, int]] = {}
        self.ends: dict[tuple[str, int], int] = {}  # next offset of each partition
        self.producer_ids = 0
        self.fetch_batch = build_batch([(None, b"r" * RECORD, [])] * FETCH_BATCH_RECORDS)

    def topic(self, name: str, partitions: int = DEFAULT_PARTITIONS) -> tuple[uuid.UUID, int]:
        if name not in self.topics:
            self.topics[name] = (uuid.uuid4(), partitions)
        return self.topics[name]

    def answer(self, api: ApiKey, version: int, req) -> dict:
        if api == ApiKey.API_VERSIONS:
            return {"error_code": 0, "throttle_time_ms": 0, "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in VERSIONS.items()]}
        if api == ApiKey.METADATA:
            names = list(self.topics) if req.topics is None else [t.name for t in req.topics]
            return {"throttle_time_ms": 0, "cluster_id": "discard", "controller_id": NODE,
                    "brokers": [{"node_id": NODE, "host": self.host, "port": self.port, "rack": None}],
                    "topics": [self.describe(n) for n in names]}
        if api == ApiKey.CREATE_TOPICS:
            rows = []
            for t in req.topics:
                topic_id, n = self.topic(t.name, t.num_partitions if t.num_partitions > 0 else DEFAULT_PARTITIONS)
                rows.append({"name": t.name, "topic_id": topic_id, "error_code": 0, "error_message": None,
                             "num_partitions": n, "replication_factor": 1})
            return {"throttle_time_ms": 0, "topics": rows}
        if api == ApiKey.INIT_PRODUCER_ID:
            self.producer_ids += 1
            return {"throttle_time_ms": 0, "error_code": 0, "producer_id": self.producer_ids, "producer_epoch": 0}
        if api == ApiKey.PRODUCE:
            return {"throttle_time_ms": 0, "responses": [
                {"name": t.name, "partition_responses": [self.produced(t.name, p) for p in t.partition_data]}
                for t in req.topic_data]}
        if api == ApiKey.LIST_OFFSETS:
            return {"throttle_time_ms": 0, "topics": [{"name": t.name, "partitions": [
                {"partition_index": p.partition_index, "error_code": 0, "timestamp": -1, "leader_epoch": 0,
                 "offset": 0 if p.timestamp == -2 else self.ends.get((t.name, p.partition_index), 0)}
                for p in t.partitions]} for t in req.topics]}
        if api == ApiKey.FETCH:
            return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
                {"topic": t.topic, "partitions": [self.fetched(t.topic, p) for p in t.partitions]}
                for t in req.topics]}
        raise ValueError(f"not answered: {api}")

    def describe(self, name: str) -> dict:
        topic_id, n = self.topic(name)
        return {"error_code": 0, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": [
            {"error_code": 0, "partition_index": p, "leader_id": NODE, "leader_epoch": 0,
             "replica_nodes": [NODE], "isr_nodes": [NODE], "offline_replicas": []} for p in range(n)]}

    def produced(self, topic: str, p) -> dict:
        key = (topic, p.index)
        base = self.ends.get(key, 0)
        view, pos, count = p.records, 0, 0
        while pos < len(view):
            h = BatchHeader.parse(view, pos)
            count += h.last_offset_delta + 1
            pos += h.size
        self.ends[key] = base + count
        return {"index": p.index, "error_code": 0, "base_offset": base, "log_append_time_ms": -1,
                "log_start_offset": 0}

    def fetched(self, topic: str, p) -> dict:
        end = self.ends.get((topic, p.partition), 0)
        offset, room, parts = p.fetch_offset, p.partition_max_bytes, []
        while offset < end and (not parts or room >= len(self.fetch_batch)):
            batch = bytearray(self.fetch_batch)
            patch_batch(batch, 0, offset, 0)
            parts.append(bytes(batch))
            offset += FETCH_BATCH_RECORDS
            room -= len(batch)
        return {"partition_index": p.partition, "error_code": 0, "high_watermark": end,
                "last_stable_offset": end, "log_start_offset": 0, "aborted_transactions": None,
                "preferred_read_replica": -1, "records": b"".join(parts)}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        supported = {int(k): v for k, v in VERSIONS.items()}
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                req = decode_request(await reader.readexactly(size), supported)
                if req.api_key == ApiKey.PRODUCE and req.body.acks == 0:
                    self.answer(req.api_key, req.api_version, req.body)
                    continue
                try:
                    body = self.answer(req.api_key, req.api_version, req.body)
                except ValueError:
                    body = {"error_code": ErrorCode.UNSUPPORTED_VERSION}
                writer.writelines(encode_response_parts(req.api_key, req.api_version, req.correlation_id, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main(host: str, port: int) -> None:
    server = await asyncio.start_server(Discard(host, port).serve, host, port, limit=1 << 20)
    print(f"discard responder on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    asyncio.run(main(args.host, args.port))
