"""Format versions: every persistent format Stratalog owns carries one; today's code reads
what it claims (data without a version is 0.1.0's, version 1) and refuses a newer version
with one message naming both, before reading or changing anything, so it never misreads.

Each test writes a newer version by hand. Kafka's own formats in segments are versioned by
Kafka (the batch magic byte: test_batch.py refuses magic other than 2). What releases
really wrote is opened in test_upgrade.py.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from stratalog.tiering import manifest, wal
from stratalog.tiering.batch import build_batch
from stratalog.tiering.errors import CorruptObject, UnsupportedFormat

TID = uuid.UUID("0b6f7c1e-2d3a-4e55-9a77-5b1c2d3e4f60")
NEWER = "has format version 2; this Stratalog reads version 1: upgrade the gateway"


def run(coro):
    return asyncio.run(coro)


# ---- WAL objects ------------------------------------------------------------------------

def _wal_object() -> bytes:
    b = wal.WalBuilder()
    b.add(TID, 0, 0, 1, 1001, build_batch([(b"k", b"v"), (None, b"w")], timestamps=[1000, 1001]))
    return b.build()[0]


def _with_version(data: bytes, header: int | None, trailer: int | None) -> bytes:
    out = bytearray(data)
    if header is not None:
        out[4:6] = header.to_bytes(2, "big")
    if trailer is not None:
        at = len(out) - wal.TRAILER_SIZE + 16
        out[at:at + 2] = trailer.to_bytes(2, "big")
    return bytes(out)


def test_wal_object_versions():
    data = _wal_object()
    assert len(wal.read_wal(data)) == 1  # version 1, as 0.1.0 wrote it
    key = "wal/1/00000000000000000042.wal"
    for header, trailer in ((2, 2), (2, None), (None, 2)):
        with pytest.raises(UnsupportedFormat) as e:
            wal.read_wal(_with_version(data, header, trailer), key)
        assert str(e.value) == f"WAL object {key} {NEWER}"
    newer_tail = _with_version(data, None, 2)[-wal.TRAILER_SIZE:]
    for read in (wal.footer_size, wal.read_footer, wal.object_size):
        with pytest.raises(UnsupportedFormat, match=NEWER):
            read(newer_tail)
    with pytest.raises(UnsupportedFormat, match="format version 0; this Stratalog reads version 1: "
                                                "it was not written by a Stratalog"):
        wal.read_wal(_with_version(data, 0, 0))
    # Still refused as corruption by whoever only knows CorruptObject.
    assert issubclass(UnsupportedFormat, CorruptObject)


# ---- manifests --------------------------------------------------------------------------

def test_manifest_versions():
    data = manifest.write_manifest("t", TID, 0, 5, 0, [])
    assert manifest.read_manifest(data).version == 5
    field = b"stratalog.manifest.format\x02"  # Avro map entry: key, then a 1-byte string
    assert data.count(field + b"1") == 1
    newer = data.replace(field + b"1", field + b"2")
    with pytest.raises(UnsupportedFormat) as e:
        manifest.read_manifest(newer, "manifests/t-x/0/00000000000000000005.avro")
    assert str(e.value) == f"manifest manifests/t-x/0/00000000000000000005.avro {NEWER}"
    with pytest.raises(CorruptObject, match="no readable stratalog.manifest.format"):
        manifest.read_manifest(data.replace(field + b"1", field + b"x"))
