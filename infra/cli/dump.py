"""Decoding for `stratalog segments dump`: one object in, readable lines out.

The byte formats belong to `tiering` (batch, wal, index, manifest); this module only
walks them, prints what it finds and collects every problem instead of stopping at the
first, so one run reports all damage in an object.
"""

from __future__ import annotations

import argparse
import bisect
from collections.abc import Callable

from stratalog.tiering import layout
from stratalog.tiering.batch import BatchHeader, CorruptBatch, batch_crc_valid, decode_records, scan_batches
from stratalog.tiering.compression import CODEC_NAMES
from stratalog.tiering.errors import CorruptObject, UnsupportedFormat
from stratalog.tiering.index import OffsetIndex, TimeIndex
from stratalog.tiering.manifest import read_manifest
from stratalog.tiering.txn import AbortedTxn, decode_marker, decode_txnindex, marker_commits
from stratalog.tiering.wal import CONFIRMATION_TOPIC_ID, decode_confirmations, read_wal

from stratalog.infra.cli.common import format_table
from stratalog.infra.cli.segments import MANIFEST, SEGMENT, WAL, kind_of

_DECODE_ERRORS = (CorruptBatch, CorruptObject, ValueError)


def show(data: bytes | None) -> str:
    """Printable UTF-8 as is, `null` for None, anything else as `hex:...`."""
    if data is None:
        return "null"
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + bytes(data).hex()
    return text if text.isprintable() else "hex:" + bytes(data).hex()


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line for line in text.splitlines()]


class Dumper:
    """Dumps objects of one store, collecting problems as `<key>: <what is wrong>`."""

    def __init__(self, store, args: argparse.Namespace, emit: Callable[[str], None] = print) -> None:
        self.store = store
        self.print_records = args.print_records
        self.deep = args.deep
        self.emit = emit
        self.problems: list[str] = []
        self._lines: list[str] = []
        self._key = ""
        # Markers seen by the last _batches call: offset -> (commits, producer id).
        self._markers: dict[int, tuple[bool, int]] = {}

    def _out(self, line: str) -> None:
        self._lines.append(line)

    def _problem(self, message: str, indent: str = "  ") -> None:
        self._out(f"{indent}PROBLEM: {message}")
        self.problems.append(f"{self._key}: {message}")

    async def dump(self, key: str) -> None:
        """Print one object; ObjectNotFound / ObjectStoreError propagate."""
        self._key, self._lines = key, []
        kind, parsed = kind_of(key)
        if kind == WAL:
            self._wal(key, parsed, await self.store.get(key))
        elif kind == SEGMENT and parsed.ext == layout.LOG:
            await self._log(key, parsed, await self.store.get(key))
        elif kind == SEGMENT and parsed.ext in (layout.INDEX, layout.TIMEINDEX):
            await self._index(key, parsed, await self.store.get(key))
        elif kind == SEGMENT and parsed.ext == layout.TXNINDEX:
            await self._txnindex(key, parsed, await self.store.get(key))
        elif kind == MANIFEST:
            await self._manifest(key, parsed, await self.store.get(key))
        else:
            await self.store.size(key)  # a missing object is reported as missing
            self._out(f"{key}")
            self._problem("not a WAL object, segment .log/.index/.timeindex/.txnindex or manifest key")
        # A blank line after each object keeps several dumps apart.
        self.emit("\n".join(self._lines) + "\n")

    # WAL objects

    def _wal(self, key: str, parsed, data: bytes) -> None:
        self._out(f"wal {key}  gateway {parsed.gateway_id}  sequence {parsed.sequence}  size {len(data)}")
        try:
            ranges = read_wal(data)
        except CorruptObject as exc:
            self._problem(str(exc))
            return
        self._out(f"  ranges {len(ranges)}")
        for info, view in ranges:
            if info.topic_id == CONFIRMATION_TOPIC_ID:
                self._confirmations(view)
                continue
            self._out(f"  range topic-id {info.topic_id}  partition {info.partition}  "
                      f"offsets {info.base_offset}..{info.last_offset}  max-timestamp {info.max_timestamp}  "
                      f"position {info.position}  length {info.length}  crc {info.crc:#010x}")
            headers = self._batches(view, "    ")
            if headers and (headers[0].base_offset != info.base_offset
                            or headers[-1].last_offset != info.last_offset):
                self._problem(f"batches cover {headers[0].base_offset}..{headers[-1].last_offset}, "
                              f"the range says {info.base_offset}..{info.last_offset}", "    ")

    def _confirmations(self, view) -> None:
        try:
            confirmed = decode_confirmations(view)
        except (CorruptObject, UnsupportedFormat) as exc:
            self._problem(f"commit confirmations: {exc}")
            return
        shown = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in confirmed.intervals)
        self._out(f"  confirms committed sequences {shown} of this gateway")

    # segment files

    async def _log(self, key: str, parsed, data: bytes) -> None:
        self._out(f"log {key}  topic {parsed.topic}  partition {parsed.partition}  "
                  f"base-offset {parsed.base_offset}  leader-epoch {parsed.leader_epoch}  size {len(data)}")
        headers = self._batches(data, "  ")
        if headers and headers[0].base_offset < parsed.base_offset:
            self._problem(f"first batch starts at offset {headers[0].base_offset}, "
                          f"below the segment's base offset {parsed.base_offset}")
        # A .txnindex exists only beside abort markers, and not for every one of them: a
        # marker for a transaction that wrote nothing here aborts nothing.
        if any(not commits for commits, _ in self._markers.values()):
            txnindex_key = key[: -len(parsed.ext)] + layout.TXNINDEX
            aborted = await self._aborted(txnindex_key, required=False)
            if aborted is not None:
                self._aborted_table(aborted, f"  aborted transactions ({txnindex_key})")
                self._check_aborted(aborted, self._markers)

    async def _aborted(self, key: str, *, required: bool) -> list[AbortedTxn] | None:
        """The entries of a .txnindex; None if it is missing (a problem if `required`) or
        does not decode (a problem)."""
        from stratalog.tiering.objectstore import ObjectNotFound

        try:
            data = await self.store.get(key)
        except ObjectNotFound:
            if required:
                self._problem(f"{key} does not exist")
            return None
        try:
            return decode_txnindex(data, key)
        except CorruptObject as exc:
            self._problem(str(exc))
            return None

    def _aborted_table(self, aborted: list[AbortedTxn], title: str) -> None:
        self._out(f"{title}  {len(aborted)}")
        if aborted:
            rows = [[a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset] for a in aborted]
            self._lines += _indent(format_table(["PRODUCER-ID", "FIRST-OFFSET", "LAST-OFFSET", "LSO"], rows), "    ")

    def _check_aborted(self, aborted: list[AbortedTxn], markers: dict[int, tuple[bool, int]]) -> None:
        """Every entry must end at an ABORT marker of its producer in the segment."""
        for a in aborted:
            if markers.get(a.last_offset) != (False, a.producer_id):
                self._problem(f"aborted transaction of producer {a.producer_id} ends at offset {a.last_offset}, "
                              f"which is not an ABORT marker of that producer in the log")

    async def _txnindex(self, key: str, parsed, data: bytes) -> None:
        self._out(f"txnindex {key}  topic {parsed.topic}  partition {parsed.partition}  "
                  f"base-offset {parsed.base_offset}  size {len(data)}")
        try:
            aborted = decode_txnindex(data, key)
        except CorruptObject as exc:
            self._problem(str(exc))
            return
        self._aborted_table(aborted, "  aborted transactions")
        if self.deep:
            log = await self._sibling_log(key, parsed)
            if log is not None:
                self._check_aborted(aborted, self._markers_in(*log))

    def _batches(self, data, indent: str) -> list[BatchHeader]:
        """Prints every batch (and, if asked, record) in `data`; returns the headers."""
        found, valid = scan_batches(data)
        view = memoryview(data)
        headers = []
        previous: BatchHeader | None = None
        self._markers = {}
        for position, header in found:
            crc_ok = batch_crc_valid(view, position)
            self._out(indent + _batch_line(position, header, crc_ok))
            if not crc_ok:
                self._problem(f"batch at position {position} (base offset {header.base_offset}): CRC mismatch",
                              indent + "  ")
            if previous is not None and header.base_offset <= previous.last_offset:
                self._problem(f"batch at position {position} starts at offset {header.base_offset}, "
                              f"not after {previous.last_offset}", indent + "  ")
            batch = view[position:position + header.size]
            if crc_ok and header.is_control:
                self._marker(batch, header, indent + "  ")
            elif crc_ok and (self.print_records or self.deep):
                self._records(batch, header, indent + "  ")
            headers.append(header)
            previous = header
        if valid != len(view):
            self._problem(f"{len(view) - valid} bytes at position {valid} are not a whole batch "
                          f"(torn or corrupt tail)", indent)
        markers = f"  markers {len(self._markers)}" if self._markers else ""
        self._out(f"{indent}batches {len(found)}  records {sum(h.records_count for h in headers)}{markers}")
        return headers

    def _marker(self, batch: memoryview, header: BatchHeader, indent: str) -> None:
        """A control batch: its COMMIT or ABORT marker, instead of its record."""
        try:
            commits, coordinator_epoch = decode_marker(batch, header, validate_crc=False)
        except _DECODE_ERRORS as exc:
            self._problem(f"control batch at base offset {header.base_offset} is not a marker: {exc}", indent)
            return
        self._markers[header.base_offset] = (commits, header.producer_id)
        self._out(f"{indent}marker {'COMMIT' if commits else 'ABORT'}  offset {header.base_offset}  "
                  f"producer {header.producer_id}/{header.producer_epoch}  "
                  f"coordinator-epoch {coordinator_epoch}")

    @staticmethod
    def _markers_in(data: bytes, log: list[tuple[int, BatchHeader]]) -> dict[int, tuple[bool, int]]:
        """offset -> (commits, producer id) of the markers among a log's (CRC-checked) batches."""
        view = memoryview(data)
        out = {}
        for position, header in log:
            if header.is_control:
                try:
                    commits = marker_commits(view[position:position + header.size], header)
                except _DECODE_ERRORS:
                    continue  # not a marker: checked when the .log itself is dumped
                out[header.base_offset] = (commits, header.producer_id)
        return out

    def _records(self, batch: memoryview, header: BatchHeader, indent: str) -> None:
        try:
            records = decode_records(batch, validate_crc=False)
        except _DECODE_ERRORS as exc:
            self._problem(f"batch at base offset {header.base_offset} does not decode: {exc}", indent)
            return
        if not self.print_records:
            return
        for r in records:
            headers = ",".join(f"{k}={show(v)}" for k, v in r.headers)
            self._out(f"{indent}offset {r.offset}  timestamp {r.timestamp}  key {show(r.key)}  "
                      f"value {show(r.value)}  headers {headers or '-'}")

    async def _index(self, key: str, parsed, data: bytes) -> None:
        is_offsets = parsed.ext == layout.INDEX
        label = "index" if is_offsets else "timeindex"
        self._out(f"{label} {key}  topic {parsed.topic}  partition {parsed.partition}  "
                  f"base-offset {parsed.base_offset}  size {len(data)}")
        try:
            if is_offsets:
                entries = OffsetIndex.from_bytes(parsed.base_offset, data).entries()
            else:
                entries = TimeIndex.from_bytes(parsed.base_offset, data).entries()
        except ValueError as exc:
            self._problem(str(exc))
            return
        self._out(f"  entries {len(entries)}")
        if entries:
            columns = ["OFFSET", "POSITION"] if is_offsets else ["TIMESTAMP", "OFFSET"]
            self._lines += _indent(format_table(columns, entries), "  ")
        if self.deep:
            log = await self._sibling_log(key, parsed)
            if log is not None:
                (_check_offset_index if is_offsets else _check_time_index)(entries, log[1], self._problem)

    async def _sibling_log(self, key: str, parsed) -> tuple[bytes, list[tuple[int, BatchHeader]]] | None:
        """The segment's .log and its CRC-checked batches, or None (a problem) if missing."""
        log_key = key[: -len(parsed.ext)] + layout.LOG
        from stratalog.tiering.objectstore import ObjectNotFound

        try:
            data = await self.store.get(log_key)
        except ObjectNotFound:
            self._problem(f"its log {log_key} does not exist")
            return None
        return data, scan_batches(data, validate_crc=True)[0]

    # manifests

    async def _manifest(self, key: str, parsed, data: bytes) -> None:
        self._out(f"manifest {key}  size {len(data)}")
        try:
            m = read_manifest(data)
        except CorruptObject as exc:
            self._problem(str(exc))
            return
        self._out(f"  topic {m.topic}  topic-id {m.topic_id}  partition {m.partition}  version {m.version}  "
                  f"log-start-offset {m.log_start_offset}  segments {len(m.segments)}")
        if (m.topic, m.topic_id, m.partition, m.version) != (parsed.topic, parsed.topic_id,
                                                               parsed.partition, parsed.version):
            self._problem(f"contents name {m.topic}-{m.topic_id}/{m.partition} version {m.version}, "
                          f"which is not what its key says")
        if m.segments:
            rows = [[s.base_offset, s.last_offset, s.size, s.min_timestamp, s.max_timestamp,
                     s.leader_epoch, s.aborted_txns, s.key_base] for s in m.segments]
            self._lines += _indent(format_table(
                ["BASE", "LAST", "SIZE", "MIN-TIMESTAMP", "MAX-TIMESTAMP", "EPOCH", "ABORTED", "KEY-BASE"], rows),
                "  ")
        if self.deep:
            from stratalog.tiering.objectstore import ObjectNotFound

            for s in m.segments:
                try:
                    size = await self.store.size(s.key_base + layout.LOG)
                except ObjectNotFound:
                    self._problem(f"segment {s.key_base}{layout.LOG} does not exist")
                    continue
                if size != s.size:
                    self._problem(f"segment {s.key_base}{layout.LOG} is {size} bytes, the manifest says {s.size}")
                if s.aborted_txns:
                    aborted = await self._aborted(s.key_base + layout.TXNINDEX, required=True)
                    if aborted is not None and len(aborted) != s.aborted_txns:
                        self._problem(f"{s.key_base}{layout.TXNINDEX} lists {len(aborted)} aborted "
                                      f"transactions, the manifest says {s.aborted_txns}")


def _batch_line(position: int, h: BatchHeader, crc_ok: bool) -> str:
    flags = [name for name, on in (("transactional", h.is_transactional), ("control", h.is_control)) if on]
    return (f"batch position {position}  offsets {h.base_offset}..{h.last_offset}  count {h.records_count}  "
            f"size {h.size}  crc {'ok' if crc_ok else 'BAD'}  "
            f"codec {CODEC_NAMES.get(h.compression, h.compression)}  "
            f"timestamp-type {'log-append' if h.timestamp_type else 'create'}  "
            f"first-timestamp {h.base_timestamp}  max-timestamp {h.max_timestamp}  "
            f"producer {h.producer_id}/{h.producer_epoch}/{h.base_sequence}  "
            f"leader-epoch {h.partition_leader_epoch}" + (f"  {' '.join(flags)}" if flags else ""))


def _check_offset_index(entries, log, problem) -> None:
    """Each entry must name a batch start, and an offset that batch holds."""
    by_position = {position: header for position, header in log}
    for offset, position in entries:
        header = by_position.get(position)
        if header is None:
            problem(f"index entry ({offset}, {position}): no batch starts at position {position} of the log")
        elif not header.base_offset <= offset <= header.last_offset:
            problem(f"index entry ({offset}, {position}): the batch there holds "
                    f"{header.base_offset}..{header.last_offset}")


def _check_time_index(entries, log, problem) -> None:
    """Each entry's offset must lie in a batch, and its timestamp must have been seen by then."""
    bases = [header.base_offset for _, header in log]
    running, highest = [], -1
    for _, header in log:
        highest = max(highest, header.max_timestamp)
        running.append(highest)
    for timestamp, offset in entries:
        slot = bisect.bisect_right(bases, offset) - 1
        if slot < 0 or offset > log[slot][1].last_offset:
            problem(f"time index entry ({timestamp}, {offset}): no batch of the log holds offset {offset}")
        elif timestamp > running[slot]:
            problem(f"time index entry ({timestamp}, {offset}): no batch up to offset {offset} "
                    f"has that timestamp (greatest {running[slot]})")
