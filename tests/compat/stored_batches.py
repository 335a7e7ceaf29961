"""What the gateway serves for a partition, read with a raw Fetch: batch by batch codecs.

A client that was asked for a codec may still send plain batches (librdkafka does when it
thinks the broker cannot take the codec, or when compressing would not shrink a batch),
and its own round trip would not notice. The compatibility tests check the codec here.
"""

from __future__ import annotations

import socket
import struct

from stratalog.gateway.protocol.frames import decode_response, encode_request
from stratalog.tiering.batch import scan_batches

FETCH, FETCH_VERSION = 1, 4
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def stored_codecs(bootstrap: str, topic: str, partition: int = 0) -> list[int]:
    """The compression codec id of every batch from offset 0 to the high watermark."""
    host, port = bootstrap.rsplit(":", 1)
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 64 << 20,
            "isolation_level": 0,
            "topics": [{"topic": topic, "partitions": [{"partition": partition, "fetch_offset": 0,
                                                        "partition_max_bytes": 64 << 20}]}]}
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(encode_request(FETCH, FETCH_VERSION, 1, body))
        (size,) = struct.unpack(">i", _read_exactly(s, 4))
        _, resp = decode_response(FETCH, FETCH_VERSION, _read_exactly(s, size))
    part = resp.responses[0].partitions[0]
    if part.error_code:
        raise AssertionError(f"fetch of {topic}-{partition} failed with error {part.error_code}")
    batches, valid = scan_batches(part.records)
    if valid != len(part.records):
        raise AssertionError(f"{topic}-{partition}: {len(part.records) - valid} bytes do not parse")
    return [h.compression for _, h in batches]


def _read_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("gateway closed the connection mid-response")
        buf += chunk
    return bytes(buf)
