"""Record-batch compression codecs, numbered as Kafka numbers them in the batch attributes.

Each codec compresses the whole records section of a batch (everything after the 61-byte
header). What is written is what Kafka's Java client writes, so any client can read it:

* gzip (1): a gzip member, deflate level 6 and mtime 0 so output is deterministic.
* snappy (2): the xerial ("snappy-java") stream: the 8-byte magic ``82 'SNAPPY' 00``, two
  big-endian int32s (version 1, minimum compatible version 1), then blocks of
  ``int32 compressed length + raw snappy block``, each block holding up to 32 KiB of input.
  Reading also accepts a bare raw snappy block (librdkafka's non-xerial output) and the
  official snappy framing format.
* lz4 (3): the LZ4 frame format with independent 64 KiB blocks and no content size, the
  frame descriptor Kafka's own LZ4 stream writes.
* zstd (4): zstandard frames. Streamed writers (zstd-jni) omit the content size, so
  reading always streams, and concatenated frames are all read.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = 32 * 1024
_SNAPPY_FRAMED_MAGIC = b"\xff\x06\x00\x00sNaPpY"
_INT32 = struct.Struct(">i")

# Larger is refused as corrupt: no client writes a batch anywhere near this, and a small
# batch that inflates past it is an attack on the reader's memory.
MAX_DECOMPRESSED_BYTES = 128 * 1024 * 1024
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZSTD_PIECE = 4096

_ZSTD_COMPRESSOR = zstandard.ZstdCompressor(level=3)
_ZSTD_DECOMPRESSOR = zstandard.ZstdDecompressor()


def compress(codec: int, data: bytes) -> bytes:
    """Compress ``data`` (a records section) with the Kafka codec numbered ``codec``."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec == SNAPPY:
        return _xerial_compress(data)
    if codec == LZ4:
        return lz4.frame.compress(
            data,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
    if codec == ZSTD:
        return _ZSTD_COMPRESSOR.compress(data)
    raise _corrupt(f"unknown compression codec {codec}")


def decompress(codec: int, data: bytes | bytearray | memoryview, *,
               limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """Decompress a records section; malformed or truncated input, or output past `limit`
    bytes (a decompression bomb), raises CorruptBatch."""
    if codec == NONE:
        return bytes(data)
    name = CODEC_NAMES.get(codec)
    if name is None:
        raise _corrupt(f"unknown compression codec {codec}")
    if not len(data):
        raise _corrupt(f"empty {name} records section")
    try:
        if codec == GZIP:
            return _drain_frames(lambda: zlib.decompressobj(_GZIP_WBITS), data, limit)
        if codec == SNAPPY:
            return _snappy_decompress(memoryview(data), limit)
        if codec == LZ4:
            return _drain_frames(lz4.frame.LZ4FrameDecompressor, data, limit)
        return _drain_frames(_ZSTD_DECOMPRESSOR.decompressobj, data, limit, piecewise=True)
    except _MalformedStream as exc:
        raise _corrupt(f"cannot decompress {name} records: {exc}") from exc
    except (OSError, EOFError, zlib.error, RuntimeError, ValueError,
            zstandard.ZstdError, cramjam.DecompressionError) as exc:
        raise _corrupt(f"cannot decompress {name} records: {exc}") from exc


class _MalformedStream(Exception):
    """A framing problem found here rather than by the codec library."""


def _corrupt(message: str) -> Exception:
    # Imported here because tiering.batch (the owner of CorruptBatch) imports this module.
    from stratalog.tiering.batch import CorruptBatch

    return CorruptBatch(message)


def _too_large(limit: int) -> _MalformedStream:
    return _MalformedStream(f"records decompress to more than {limit} bytes")


def _drain_frames(new_decompressor, data, limit: int, *, piecewise: bool = False) -> bytes:
    """Decode every concatenated frame (gzip members); a frame cut short is an error, not
    an empty tail, and so is output past `limit`.

    gzip and lz4 decompressors stop at a requested output length. zstd's cannot, so it is
    fed `_ZSTD_PIECE` bytes at a time: zstd expands by at most ~32,000x, so one piece can
    overshoot the limit by tens of MiB, never by gigabytes.
    """
    out: list[bytes] = []
    produced = 0

    def keep(chunk: bytes) -> None:
        nonlocal produced
        produced += len(chunk)
        if produced > limit:
            raise _too_large(limit)
        out.append(chunk)

    rest = bytes(data)
    while rest:
        decompressor = new_decompressor()
        if piecewise:
            pos = 0
            while pos < len(rest) and not decompressor.eof:
                keep(decompressor.decompress(rest[pos:pos + _ZSTD_PIECE]))
                pos += _ZSTD_PIECE
            # The next frame starts in what the decompressor left of the last piece.
            unused = decompressor.unused_data + rest[pos:] if decompressor.eof else b""
        else:
            keep(decompressor.decompress(rest, limit - produced + 1))
            unused = decompressor.unused_data
        if not decompressor.eof:
            raise _MalformedStream("compressed records section is truncated")
        rest = unused
    return b"".join(out)


def _xerial_compress(data: bytes) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER.pack(_XERIAL_MAGIC, 1, 1)]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(view: memoryview, limit: int) -> bytes:
    if view[:8] == _XERIAL_MAGIC and len(view) >= _XERIAL_HEADER.size:
        return _xerial_decompress(view, limit)
    if view[:10] == _SNAPPY_FRAMED_MAGIC:
        # Framed chunks hold at most 64 KiB each, so the output is a bounded multiple of
        # the input.
        return bytes(cramjam.snappy.decompress(view))
    return _raw_snappy(view, limit)


def _raw_snappy(block: memoryview, limit: int) -> bytes:
    # A raw block starts with its decompressed length: refuse a bomb before inflating it.
    if cramjam.snappy.decompress_raw_len(block) > limit:
        raise _too_large(limit)
    return bytes(cramjam.snappy.decompress_raw(block))


def _xerial_decompress(view: memoryview, limit: int) -> bytes:
    out = []
    produced = 0
    pos = _XERIAL_HEADER.size
    end = len(view)
    while pos < end:
        if pos + 4 > end:
            raise _MalformedStream("xerial snappy block length is truncated")
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise _MalformedStream(f"xerial snappy block of {length} bytes overruns the data")
        block = _raw_snappy(view[pos:pos + length], limit - produced)
        produced += len(block)
        out.append(block)
        pos += length
    return b"".join(out)
