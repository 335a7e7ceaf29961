"""The records every client compatibility test produces and expects back.

Each client test writes these records (per codec) with its own API and checks that what
it consumes equals them: keys, values (including null and empty), headers, order.
"""

from __future__ import annotations

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def records(codec: str, n: int = 20) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"key-{i % 5}".encode()
        if i % 10 == 4:
            value = None
        elif i % 10 == 5:
            value = b""
        else:
            value = f"{codec}-value-{i}-".encode() * (1 + i % 3)
        headers = [("h1", f"v{i}".encode()), ("codec", codec.encode())] if i % 2 == 0 else []
        out.append((key, value, headers))
    return out
