"""`spark.readStream.format("stratalog")`: micro-batches of newly committed records.

An offset is ``{"<topic>": {"<partition>": next_offset}}``: for each partition, the offset
after the last record the stream has reached. Each trigger re-reads the topic's metadata
and moves every partition's offset to its end: with a coordinator (`spark.metadata`), the
high watermark (read_committed: the last stable offset), so records appear within a
trigger of their WAL flush; from manifests alone (a LIST per topic, a GET per changed
manifest), the end of the sealed segments, so records appear once their segment seals.
Micro-batch boundaries are offsets, not segment names: re-planning a batch after a
restart, even after a compaction swapped the segments underneath, reads the same offsets.
With a checkpointed file sink each record lands exactly once.

Examples
--------
>>> q = (spark.readStream.format("stratalog").option("topic", "orders")
...      .option("startingOffsets", "earliest").load("s3://bucket/prefix")
...      .writeStream.format("parquet").option("checkpointLocation", "/ckpt")
...      .start("/out"))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from stratalog.spark.metadata import TopicNotFound, open_metadata
from stratalog.spark.options import EARLIEST, LATEST, OptionError, parse_options
from stratalog.spark.planning import DataLoss, first_offset_at, plan_partition


class StratalogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are per-partition next offsets of committed data; see the module docstring."""

    def __init__(self, options: dict) -> None:
        self.options = parse_options(options, streaming=True)
        if self.options.ending_timestamp is not None:
            raise OptionError("option endingTimestamp is for batch reads only")
        self._store = None
        self._meta = None
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow's end
        # initialOffset turns a starting timestamp into offsets; micro-batches are offsets only.
        self._plain = replace(self.options, starting_timestamp=None)

    def _snapshot(self):
        if self._meta is None:
            self._store = self.options.store.open()
            self._meta = open_metadata(self._store, self.options.topic,
                                       coordinator=self.options.coordinator,
                                       topic_id=self.options.topic_id,
                                       read_committed=self.options.read_committed)
        try:
            return self._meta.snapshot().only(self.options.partitions)
        except TopicNotFound:
            return None

    def _wrap(self, ends: dict[int, int]) -> dict:
        return {self.options.topic: {str(p): o for p, o in sorted(ends.items())}}

    def _unwrap(self, offset: dict) -> dict[int, int]:
        try:
            return {int(p): int(o) for p, o in offset[self.options.topic].items()}
        except (KeyError, AttributeError, ValueError, TypeError):
            raise OptionError(f"checkpointed offset {offset!r} is not an offset of topic "
                              f"{self.options.topic!r} (was the checkpoint made for another topic?)") from None

    def _sealed_ends(self) -> dict[int, int]:
        snapshot = self._snapshot()
        if snapshot is None:
            return {}
        return {p: snap.end(self.options.read_committed) for p, snap in snapshot.partitions.items()}

    def _first_offset(self, p: int, snap) -> int:
        ts = self.options.starting_timestamp.for_partition(p) if self.options.starting_timestamp else None
        if ts is not None:
            return first_offset_at(snap, self.options, ts, self._store)
        wanted = self.options.starting.for_partition(p)
        if wanted == EARLIEST:
            return snap.start
        if wanted == LATEST:
            return snap.end(self.options.read_committed)
        return max(wanted, snap.start)

    def initialOffset(self) -> dict:
        snapshot = self._snapshot()
        if snapshot is None:
            return self._wrap({})
        return self._wrap({p: self._first_offset(p, snap) for p, snap in snapshot.partitions.items()})

    def getDefaultReadLimit(self):
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._sealed_ends()

    def latestOffset(self, start: dict, limit) -> dict:
        begin = self._unwrap(start)
        ends = self._target if self._target is not None else self._sealed_ends()
        # A partition new since `start` (the topic grew) starts at its earliest offset.
        wanted = {p: max(end, begin.get(p, 0)) for p, end in ends.items()}
        for p, offset in begin.items():
            wanted.setdefault(p, offset)
        if isinstance(limit, ReadMaxRows):
            wanted = _cap(begin, wanted, limit.max_rows)
        return self._wrap(wanted)

    def reportLatestOffset(self):
        return self._wrap(self._sealed_ends())

    def partitions(self, start: dict, end: dict):
        begin, until = self._unwrap(start), self._unwrap(end)
        snapshot = self._snapshot()
        if snapshot is None:
            return []
        slices = []
        for p, stop in sorted(until.items()):
            snap = snapshot.partitions.get(p)
            first = begin.get(p, snap.start if snap else 0)
            if snap is None or first >= stop:
                continue
            if first < snap.start and self.options.fail_on_data_loss and snap.segments:
                raise DataLoss(f"{self.options.topic}-{p}: the stream is at offset {first} but "
                               f"the log now starts at {snap.start} (retention removed records "
                               "before they were read); set failOnDataLoss=false to skip them")
            slices.extend(plan_partition(snap, self.options.topic, max(first, snap.start), stop,
                                         self._plain, self._store, str(snapshot.topic_id)))
        return slices

    def read(self, partition):
        from stratalog.spark.reading import read_rows

        return read_rows(partition, self.options)

    def stop(self) -> None:
        """Close the coordinator connection the triggers shared."""
        if self._meta is not None and hasattr(self._meta, "close"):
            self._meta.close()

    def commit(self, end: dict) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, objects are immutable."""


def _cap(begin: dict[int, int], wanted: dict[int, int], max_rows: int) -> dict[int, int]:
    """Spread at most `max_rows` offsets over partitions in proportion to their backlog."""
    backlog = {p: wanted[p] - begin.get(p, wanted[p]) for p in wanted}
    total = sum(n for n in backlog.values() if n > 0)
    if total <= max_rows:
        return wanted
    out = {}
    for p, end in wanted.items():
        start = begin.get(p, end)
        share = backlog[p] * max_rows // total if backlog[p] > 0 else 0
        out[p] = start + max(share, 1 if backlog[p] > 0 else 0)
    return out
