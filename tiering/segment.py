"""The local active segment: the partition's hot cache of recently appended batches."""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from stratalog.tiering.batch import (
    HEADER_SIZE,
    LOG_APPEND_TIME,
    BatchHeader,
    CorruptBatch,
    batch_crc_valid,
    decode_records,
    scan_batches,
)
from stratalog.tiering.index import OffsetIndex, TimeIndex

_INT32_MAX = (1 << 31) - 1
_I64 = struct.Struct(">q")
# pwritev takes at most this many buffers per call (EINVAL beyond it).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
_START_WRITEBACK = getattr(os, "POSIX_FADV_DONTNEED", None) if sys.platform == "linux" else None
_NO_TIMESTAMP = -1
_SCAN_CHUNK = 1 << 20


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka's file name: the base offset zero-padded to 20 digits plus ``suffix``."""
    return f"{base_offset:020d}{suffix}"


@dataclass(slots=True, frozen=True)
class SealedSegment:
    """What sealing hands to the uploader: the log file plus both index sidecars."""

    base_offset: int
    last_offset: int
    size: int
    min_timestamp: int
    max_timestamp: int
    log_path: Path
    index_bytes: bytes
    timeindex_bytes: bytes


class _ChunkedReader:
    """Serves small reads at increasing positions from one large pread."""

    def __init__(self, fd: int, chunk: int = _SCAN_CHUNK) -> None:
        self._fd = fd
        self._chunk = chunk
        self._start = 0
        self._buf = b""

    def read(self, pos: int, length: int) -> memoryview:
        if pos < self._start or pos + length > self._start + len(self._buf):
            self._buf = os.pread(self._fd, max(length, self._chunk), pos)
            self._start = pos
        offset = pos - self._start
        return memoryview(self._buf)[offset:offset + length]


class ActiveSegment:
    """One segment of a partition's log on local disk, as Kafka's ``LogSegment`` keeps it.

    Its file in ``directory`` is ``<base:020>.log`` (the zero-padded base offset): whole v2
    batches back to back (layout in ``tiering.batch``), offsets strictly increasing from
    ``base_offset``, never more than 2^31 - 1 bytes and never a last offset more than
    2^31 - 1 above the base (both indexes store 32-bit relative values).

    Its ``.index`` and ``.timeindex`` (``tiering.index``) are kept in memory and handed to
    the uploader by ``seal``, never written here: nothing reads them from local disk (the
    bucket's copies are what readers use), and creating two files per seal on the event
    loop held up every request for milliseconds when all partitions rolled at once.
    Files of those names, left by versions that wrote them, are removed on open.

    Indexing follows Kafka: before appending a batch, once more than
    ``index_interval_bytes`` have been appended since the last entry, the offset index
    gets (batch last offset, batch position) and the time index gets (greatest timestamp
    so far, last offset of the batch that carried it). Sealing adds that time entry once
    more, so the sidecars cover the whole segment. Recovery replays the same rule over the
    file, so recovered indexes equal the ones appends built.

    Nothing is fsynced: acknowledged data is durable through WAL objects in the object
    store, and a torn tail is cut off when the file is reopened. Appended batches are
    written to the file in runs (`write_unwritten`, at the latest when anything reads the
    file or UNWRITTEN_LIMIT bytes wait), not one system call per batch: produce requests
    are small and many, and a write here costs as much as the rest of an append.
    """

    UNWRITTEN_LIMIT = 256 * 1024

    def __init__(self, directory: Path, base_offset: int, fd: int, *,
                 index_interval_bytes: int, now_ms: int) -> None:
        if index_interval_bytes < 0:
            raise ValueError(f"index_interval_bytes must be >= 0, got {index_interval_bytes}")
        self._directory = Path(directory)
        self._base_offset = base_offset
        self._fd: int | None = fd
        self._index_interval_bytes = index_interval_bytes
        self._created_ms = now_ms
        self._sealed: SealedSegment | None = None
        self._unwritten: list[memoryview] = []  # appended, not yet in the file, in order
        self._unwritten_bytes = 0
        self._reset()

    def _reset(self) -> None:
        self._size = 0
        self._next_offset = self._base_offset
        self._offset_index = OffsetIndex(self._base_offset)
        self._time_index = TimeIndex(self._base_offset)
        self._bytes_since_index_entry = 0
        self._max_timestamp = _NO_TIMESTAMP
        self._offset_of_max_timestamp = self._base_offset
        self._min_timestamp: int | None = None

    @classmethod
    def create(cls, directory: Path, base_offset: int, *, index_interval_bytes: int = 4096,
               now_ms: int) -> ActiveSegment:
        """Start a new empty segment; an existing ``.log`` for this base is FileExistsError."""
        if base_offset < 0:
            raise ValueError(f"base offset must be >= 0, got {base_offset}")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / segment_file_name(base_offset, ".log"),
                     os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        return cls(directory, base_offset, fd,
                   index_interval_bytes=index_interval_bytes, now_ms=now_ms)

    @classmethod
    def open(cls, directory: Path, base_offset: int, *, index_interval_bytes: int = 4096,
             now_ms: int) -> ActiveSegment:
        """Reopen an existing ``.log``: keep its valid prefix, cut a torn tail, rebuild indexes."""
        directory = Path(directory)
        fd = os.open(directory / segment_file_name(base_offset, ".log"), os.O_RDWR)
        try:
            segment = cls(directory, base_offset, fd,
                          index_interval_bytes=index_interval_bytes, now_ms=now_ms)
            segment._remove_sidecars()
            segment._recover()
        except BaseException:
            os.close(fd)
            raise
        return segment

    # -- properties --------------------------------------------------------------------

    @property
    def base_offset(self) -> int:
        return self._base_offset

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def last_offset(self) -> int:
        return self._next_offset - 1

    @property
    def size(self) -> int:
        return self._size

    @property
    def created_ms(self) -> int:
        return self._created_ms

    @property
    def max_timestamp(self) -> int:
        """Greatest batch max timestamp, or -1 while empty."""
        return self._max_timestamp

    @property
    def min_timestamp(self) -> int:
        """Smallest batch base timestamp (the batch's first record; records later in a
        CreateTime batch may be earlier), or -1 while empty."""
        return _NO_TIMESTAMP if self._min_timestamp is None else self._min_timestamp

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def log_path(self) -> Path:
        return self._directory / segment_file_name(self._base_offset, ".log")

    @property
    def index_path(self) -> Path:
        return self._directory / segment_file_name(self._base_offset, ".index")

    @property
    def timeindex_path(self) -> Path:
        return self._directory / segment_file_name(self._base_offset, ".timeindex")

    @property
    def offset_index(self) -> OffsetIndex:
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        return self._time_index

    # -- writing -----------------------------------------------------------------------

    def fits(self, header: BatchHeader) -> bool:
        """Whether the batch fits the 32-bit limits of this segment's indexes (else roll)."""
        return (self._size + header.size <= _INT32_MAX
                and header.last_offset - self._base_offset <= _INT32_MAX)

    def append(self, batch: bytes | bytearray | memoryview,
               header: BatchHeader | None = None) -> int:
        """Append one already-patched batch and return its position in the file.

        The batch bytes are kept, not copied, until they are written: the caller must not
        change them. ``header``, when given, must describe them as they are (parsed after
        ``patch_batch``); only its base offset is checked against the bytes.
        """
        if self._fd is None or self._sealed is not None:
            self._writable_fd()  # raises: closed or sealed
        view = memoryview(batch).cast("B")
        if header is None:
            actual = BatchHeader.parse(view)
        else:
            actual = header
            if _I64.unpack_from(view, 0)[0] != header.base_offset:
                raise ValueError("header does not describe the batch bytes "
                                 "(was it parsed before patch_batch?)")
        if actual.size != len(view):
            raise CorruptBatch(f"batch length field gives {actual.size} bytes, got {len(view)}")
        if actual.base_offset < self._next_offset:
            raise ValueError(f"batch base offset {actual.base_offset} is below the segment's "
                             f"next offset {self._next_offset}")
        if actual.last_offset_delta < 0:
            raise CorruptBatch(f"negative last offset delta {actual.last_offset_delta}")
        if not self.fits(actual):
            raise ValueError("batch does not fit this segment's 32-bit index limits; roll it")
        if self._unwritten_bytes >= self.UNWRITTEN_LIMIT:
            # Before anything changes: a write that fails (a full disk) appends nothing.
            self.write_unwritten()
        position = self._size
        self._unwritten.append(view)
        self._unwritten_bytes += len(view)
        self._size += len(view)
        self._track(actual, position)
        return position

    def write_unwritten(self) -> None:
        """Write the appended batches not yet in the file, with one system call."""
        if not self._unwritten or self._fd is None:
            return
        views = self._unwritten
        start = position = self._size - self._unwritten_bytes
        total = self._unwritten_bytes
        # An OSError leaves them all unwritten, to be written again from the same position
        # (rewriting a run that did reach the file writes the same bytes).
        for first in range(0, len(views), _IOV_MAX):
            run = views[first:first + _IOV_MAX]
            wanted = sum(map(len, run))
            done = os.pwritev(self._fd, run, position)
            while done < wanted:  # a short write: finish it from where it stopped
                done += os.pwrite(self._fd, b"".join(run)[done:], position + done)
            position += wanted
        self._unwritten, self._unwritten_bytes = [], 0
        if _START_WRITEBACK is not None:
            # Start writing these pages to disk now, without waiting (Linux starts the
            # writeback of dirty pages it is advised of and keeps them cached): sealing
            # then finds little left to fsync, instead of gigabytes whose writeback
            # would stall every WAL fsync on the same file system for as long.
            os.posix_fadvise(self._fd, start, total, _START_WRITEBACK)

    def _track(self, header: BatchHeader, position: int) -> None:
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.last_offset
        if self._bytes_since_index_entry > self._index_interval_bytes:
            self._offset_index.append(header.last_offset, position)
            self._time_index.append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size
        if header.records_count > 0:
            earliest = (header.max_timestamp if header.timestamp_type == LOG_APPEND_TIME
                        else header.base_timestamp)
            if self._min_timestamp is None or earliest < self._min_timestamp:
                self._min_timestamp = earliest
        self._next_offset = header.last_offset + 1

    def _recover(self) -> None:
        fd = self._open_fd()
        file_size = os.fstat(fd).st_size
        reader = _ChunkedReader(fd)
        position = 0
        while position + HEADER_SIZE <= file_size:
            try:
                header = BatchHeader.parse(reader.read(position, HEADER_SIZE))
            except CorruptBatch:
                break
            if (position + header.size > file_size
                    or header.base_offset < self._next_offset
                    or header.last_offset_delta < 0
                    or not self.fits(header)
                    or not batch_crc_valid(reader.read(position, header.size))):
                break
            self._size = position + header.size
            self._track(header, position)
            position += header.size
        if position < file_size:
            os.ftruncate(fd, position)

    def truncate_to(self, offset: int) -> None:
        """Drop every batch holding an offset at or above ``offset``.

        A batch that straddles ``offset`` goes too, so ``next_offset`` may end up below it.
        """
        fd = self._writable_fd()
        if offset >= self._next_offset:
            return
        position = 0 if offset <= self._base_offset else self._find_batch(offset)[0]
        os.ftruncate(fd, position)
        self._reset()
        self._recover()

    def seal(self) -> SealedSegment:
        """Finish the segment (Kafka's onBecomeInactiveSegment) and describe it for upload.

        Adds the final time index entry, gives both indexes as bytes and refuses appends
        from then on; reads keep working until ``close``. Nothing is written to disk.
        """
        if self._sealed is not None:
            return self._sealed
        self._writable_fd()
        self._time_index.append(self._max_timestamp, self._offset_of_max_timestamp)
        index_bytes = self._offset_index.to_bytes()
        timeindex_bytes = self._time_index.to_bytes()
        self._sealed = SealedSegment(
            base_offset=self._base_offset,
            last_offset=self.last_offset,
            size=self._size,
            min_timestamp=self.min_timestamp,
            max_timestamp=self._max_timestamp,
            log_path=self.log_path,
            index_bytes=index_bytes,
            timeindex_bytes=timeindex_bytes,
        )
        return self._sealed

    def close(self) -> None:
        """Release the file; idempotent."""
        if self._fd is not None:
            try:
                self.write_unwritten()
            except OSError:
                pass  # a full disk: the file is a cache of what the WAL holds
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        """Close and remove the segment's file."""
        self._unwritten, self._unwritten_bytes = [], 0
        self.close()
        self.log_path.unlink(missing_ok=True)

    def _remove_sidecars(self) -> None:
        self.index_path.unlink(missing_ok=True)
        self.timeindex_path.unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``: always that first batch, then more
        while the total stays within ``max_bytes``. Empty at or past ``next_offset``."""
        if offset >= self._next_offset:
            return b""
        fd = self._open_fd()
        position, header = self._find_batch(max(offset, self._base_offset))
        if header.size >= max_bytes:
            return self._pread(fd, header.size, position)
        limit = position + max_bytes
        if limit >= self._size:
            return self._pread(fd, self._size - position, position)  # whole batches to the end
        data = self._pread(fd, max_bytes, position)
        # Cut after the last whole batch, walking only from the last indexed batch before
        # the limit: a fetch of small batches would otherwise parse every header it returns.
        scan_from = max(self._offset_index.position_at_or_before(limit), position) - position
        _, valid = scan_batches(memoryview(data)[scan_from:])
        return data[:scan_from + valid]

    def find_timestamp(self, timestamp: int, starting_offset: int = 0) -> tuple[int, int] | None:
        """``(timestamp, offset)`` of the first record at or after ``timestamp`` whose offset is
        at least ``starting_offset``, or None if there is none (Kafka's findOffsetByTimestamp)."""
        if self._size == 0 or timestamp > self._max_timestamp:
            return None
        fd = self._open_fd()
        lower = max(self._time_index.lookup(timestamp), starting_offset)
        position = self._offset_index.lookup(lower)[1]
        reader = _ChunkedReader(fd, 64 * 1024)
        while position < self._size:
            header = BatchHeader.parse(reader.read(position, HEADER_SIZE))
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                for record in decode_records(self._pread(fd, header.size, position)):
                    if record.timestamp >= timestamp and record.offset >= starting_offset:
                        return record.timestamp, record.offset
            position += header.size
        return None

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Offset of the first record whose timestamp is >= ``timestamp``, or None."""
        found = self.find_timestamp(timestamp)
        return None if found is None else found[1]

    def _find_batch(self, offset: int) -> tuple[int, BatchHeader]:
        """Position and header of the first batch whose last offset is >= ``offset``."""
        fd = self._open_fd()
        position = self._offset_index.lookup(offset)[1]
        reader = _ChunkedReader(fd, 64 * 1024)
        while position < self._size:
            header = BatchHeader.parse(reader.read(position, HEADER_SIZE))
            if header.last_offset >= offset:
                return position, header
            position += header.size
        raise ValueError(f"offset {offset} is not in segment {self._base_offset}")

    @staticmethod
    def _pread(fd: int, length: int, position: int) -> bytes:
        data = os.pread(fd, length, position)
        if len(data) != length:
            raise CorruptBatch(f"segment file ended at {position + len(data)}, "
                               f"expected {length} bytes from {position}")
        return data

    def _open_fd(self) -> int:
        """The file, with every appended batch in it (reads, sealing and truncation see it)."""
        if self._fd is None:
            raise ValueError(f"segment {self._base_offset} is closed")
        if self._unwritten:
            self.write_unwritten()
        return self._fd

    def _writable_fd(self) -> int:
        fd = self._open_fd()
        if self._sealed is not None:
            raise ValueError(f"segment {self._base_offset} is sealed")
        return fd

    def __repr__(self) -> str:
        return (f"ActiveSegment({self.log_path}, offsets {self._base_offset}.."
                f"{self.last_offset}, {self._size} bytes)")
